"""Split timings as split_timing measures them, for the verdicts' tests: each candidate's ms per call round by
round."""

NOISE = (1.0, 0.98, 1.02, 0.99, 1.01)  # a machine's drift, alike for every candidate of a round


def in_rounds(times: dict) -> dict:
    """{setting: {(batch, key): ms}} as five rounds of each, every round moved by the same NOISE factor: each
    ratio to the whole call is then the same in every round (its interval is its median)."""
    return {setting: {key: [ms * f for f in NOISE] for key, ms in timed.items()} for setting, timed in times.items()}
