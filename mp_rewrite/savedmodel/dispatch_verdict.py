"""Whether a batch dispatch is kept, and what the conversion says about it: pure Python over measured times, no
TensorFlow (savedmodel/batch_dispatch.py measures and builds; this module decides and words it).

A batch dispatch runs, inside one signature, float32 at the batch sizes where float32 won the race and the low
precision where that won (`segments_of`). It is kept only where it measured as fast as the best single variant at
every batch raced (a tie inside the noise counts) and faster than each single variant across the batches, beyond
the noise (`dispatch_verdict`): the dispatch pays a `tf.cond` per call and, frozen, the float32 weights beside the
low-precision ones, and a mechanism that does not pay for itself everywhere is not written.
"""

from __future__ import annotations

import dataclasses
import math

from ..analysis.race_times import RaceTimes, faster, geometric_mean, ties

FLOAT32, LOW, DISPATCH = 0, 1, 2  # the variants' places in a race's times: float32, the low precision, the dispatch
# The names a written dispatch leaves, which `inspect` finds: the frozen signature's function (its FunctionDef:
# "__inference_dispatch_on_batch_12") and, in place, each body's float32 copy ("<body>_mp_dispatch_float32").
DISPATCH_FUNCTION = "dispatch_on_batch"
FLOAT32_SUFFIX = "_mp_dispatch_float32"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What the dispatch measured against each variant alone.

    Attributes:
        kept: whether it is written.
        losses: ((batch, the dispatch's Ratio over the best single variant there, that variant),) at the batches
            where it was slower beyond the noise.
        overall: (the dispatch's Ratio over float32's, over the low precision's), geometric means across the batches.
    """

    kept: bool
    losses: tuple
    overall: tuple


def as_race(times) -> RaceTimes:
    """A RaceTimes, or one made of [ms per variant] (medians of one round: ratios without an interval)."""
    return times if isinstance(times, RaceTimes) else RaceTimes.of_medians(list(times))


def winners_of(times: dict, written: int = LOW) -> dict:
    """{batch: FLOAT32 or LOW, whichever ran faster there} from {batch: RaceTimes (or [ms]) of float32 and the low
    precision}. Unless the other variant than `written` (what the race chose) was faster beyond the noise at some
    batch (the paired ratio's interval, and more than core.assignment.RESOLUTION), `written` wins everywhere: nothing
    to dispatch (at load 6, MobileNetV2 96x96's two variants tied at every batch, and the medians alone made a
    different threshold in each of three runs). Where it was, each batch goes to the faster median: a tie between
    two batches won either way places the threshold by the best estimate there is (five rounds called MobileNetV2
    96x96's batch 8 a tie that nine showed bfloat16 1.3x faster at, and the dispatch then ran float32 there)."""
    other = FLOAT32 if written == LOW else LOW
    races = {b: as_race(t) for b, t in sorted(times.items())}
    if not any(faster(t.ratio(other, written)) for t in races.values()):
        return {b: written for b in races}
    return {b: other if t.ratio(other, written).mid < 1 else written for b, t in races.items()}


def segments_of(winners: dict) -> tuple:
    """((first batch size, variant),) in order: each variant from its first batch size up to the next one's (the
    first from batch 1); neighbouring batches with one winner make one segment."""
    out = []
    for batch, variant in sorted(winners.items()):
        if not out or out[-1][1] != variant:
            out.append((1 if not out else batch, variant))
    return tuple(out)


def dispatches(function_names) -> bool:
    """Whether a written model's functions (their names) hold a batch dispatch (batch_dispatch, dispatch_in_place)."""
    return any(DISPATCH_FUNCTION in name or FLOAT32_SUFFIX in name for name in function_names)


def dispatch_verdict(times: dict) -> Verdict:
    """Keep the dispatch or not, from {batch: RaceTimes (or [ms]) of (float32, low precision, dispatch)}, each
    batch's variants run in alternated rounds.

    Kept when at every batch the dispatch ties with or beats the faster single variant there (`ties`), and across
    the batches (geometric mean of its paired ratios) it is faster than float32 alone and than the low precision
    alone, beyond the noise (`faster`). A batch where a single variant did not run is left out; none left: not kept.
    """
    races = {b: as_race(t) for b, t in sorted(times.items())}
    races = {b: t for b, t in races.items() if all(math.isfinite(m) for m in t.medians)}
    if not races:
        return Verdict(False, (), ())
    losses = []
    for batch, t in races.items():
        best = min((FLOAT32, LOW), key=lambda v: t.medians[v])
        ratio = t.ratio(DISPATCH, best)
        if not ties(ratio):
            losses.append((batch, ratio, best))
    overall = tuple(geometric_mean(t.ratio(DISPATCH, v) for t in races.values()) for v in (FLOAT32, LOW))
    return Verdict(not losses and all(map(faster, overall)), tuple(losses), overall)


def segments_text(segments, precision: str) -> str:
    """"float32 below batch 8, bfloat16 from 8" (and "float32 again from 64" for a third segment)."""
    names = ("float32", precision)
    parts = [f"{names[segments[0][1]]} below batch {segments[1][0]}"]
    for i, (start, variant) in enumerate(segments[1:], 1):
        again = " again" if any(v == variant for _, v in segments[:i]) else ""
        parts.append(f"{names[variant]}{again} from {start}" if i > 1 else f"{names[variant]} from {start}")
    return ", ".join(parts)


def times_text(times: dict, precision: str) -> str:
    """"at batch 1 / 8 / 32: the dispatch 1.6 / 6.1 / 20.3 ms per call, float32 1.6 / 9.0 / 45.1, bfloat16 1.9 /
    6.0 / 20.2"."""
    races = {b: as_race(t) for b, t in sorted(times.items())}
    each = [" / ".join(f"{t.medians[v]:.1f}" for t in races.values()) for v in (DISPATCH, FLOAT32, LOW)]
    return (f"at batch {' / '.join(map(str, races))}: the dispatch {each[0]} ms per call, float32 {each[1]}, "
            f"{precision} {each[2]}")


def kept_line(verdict: Verdict, times: dict, segments, precision: str, sizes: tuple, forced: str = "",
              stored: str = "both frozen graphs are stored") -> str:
    """The first line a conversion says where the dispatch is written: what runs where, what it costs in size, and
    the times. `sizes`: (float32 graph MB, low-precision graph MB); `forced`: why it was written whatever it
    measured (a test-only setting), else ""; `stored`: what the written model holds twice."""
    f32, low = sizes
    against = ", ".join(f"{r.text()} {name}'s time" for r, name in zip(verdict.overall, ("float32", precision)))
    why = forced or "as fast as the faster variant at every batch and faster than either alone across them"
    return (f"wrote a batch dispatch: {segments_text(segments, precision)} (each call runs the variant that won at "
            f"its batch size; {stored}, {_size(f32)} + {_size(low)} against {_size(low)} for "
            f"{precision} alone): {why} -- {against} across the batches; {times_text(times, precision)}, measured "
            "here")


def refused_line(verdict: Verdict, times: dict, segments, precision: str, written: int) -> str:
    """What the conversion adds to its first line where the dispatch was measured and not kept: where it lost,
    and which batch sizes lose with the variant written alone (`written`: FLOAT32 or LOW)."""
    names = ("float32", precision)
    why = [f"it ran {r.text()} {names[best]}'s time at batch {b}" for b, r, best in verdict.losses]
    slow = [f"{n}'s" for r, n in zip(verdict.overall, names) if r and not faster(r)]
    if slow:
        why.append(f"it was no faster than {' or '.join(slow)} across the batches "
                   f"({', '.join(r.text() for r in verdict.overall)} of float32's and {precision}'s)")
    other = LOW if written == FLOAT32 else FLOAT32
    lose = [f"{b} ({r.text()} {names[other]}'s time)" for b, t in sorted(times.items())
            for r in [as_race(t).ratio(written, other)] if math.isfinite(r.mid) and not ties(r)]
    said = (f"; with {names[written]} alone batch {', '.join(lose)} lose{'s' if len(lose) == 1 else ''}"
            if lose else f"; {names[written]} alone loses at no batch raced beyond the noise")
    return (f"; a batch dispatch ({segments_text(segments, precision)}) was measured and not kept: "
            f"{'; '.join(why) or 'it did not run'} ({times_text(times, precision)}){said}")


def _size(mb: float) -> str:
    """"13.7 MB", or "48 KB" below a tenth of a MB."""
    return f"{mb:.1f} MB" if mb >= 0.1 else f"{mb * 1000:.0f} KB"
