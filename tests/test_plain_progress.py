"""Progress wherever the work is long, and no coloring that splits a number (issue 39, item 5)."""

from __future__ import annotations

import io
import time

from rich.console import Console

from mp_rewrite.commands.verify import StepLines, stdout_console


def test_steps_are_lines_when_the_output_is_not_a_terminal():
    out = io.StringIO()
    silent = io.StringIO()
    StepLines("tuning", stream=silent)(4, 4, "writing 'cost'")  # done within `after` (10 s): nothing said
    assert silent.getvalue() == ""
    lines = StepLines("tuning", stream=out, every=0.05, after=0)
    lines(0, 4, "converting 'cost' (candidate 1 of 2)")
    lines(1, 4, "converting 'float32' (candidate 2 of 2), about 3 s left")  # within `every`: left out
    time.sleep(0.06)
    lines(2, 4, "verifying 'cost' (candidate 1 of 2), about 2 s left")
    lines(4, 4, "writing 'cost'")  # the last, always
    assert out.getvalue().splitlines() == ["tuning: 0/4 converting 'cost' (candidate 1 of 2)",
                                           "tuning: 2/4 verifying 'cost' (candidate 1 of 2), about 2 s left",
                                           "tuning: 4/4 writing 'cost'"]


def test_a_ratio_is_never_colored_in_two_pieces(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # a terminal, as rich sees it
    console = stdout_console()
    assert console.is_terminal
    with console.capture() as captured:
        console.print("'no-depthwise' ran 2.31x float32's speed, [green]pass[/]")
    text = captured.get()
    assert "2.31x" in text and "\x1b[32mpass" in text, repr(text)
    plain = Console(force_terminal=True)  # rich's default highlighting, what the CLI used
    with plain.capture() as captured:
        plain.print("2.31x")
    assert "2.31x" not in captured.get()  # the split this test guards against
