"""How `benchmarks_perf.scale` turns its rounds into a slope: each size's runs of a round
averaged (there and back), each round's slope, and the median of them."""

from __future__ import annotations

import math

import pytest

from benchmarks_perf.scale import Measure, Trial, render, slope

WORK = (1_000, 4_000, 16_000)


def _row(rounds: list[tuple[float, float, float]]) -> list[Measure]:
    return [
        Measure(w, min(r[i] for r in rounds), 100.0, 50.0, [r[i] for r in rounds])
        for i, w in enumerate(WORK)
    ]


def _cells(table: str, op: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {op} ("))
    return [c.strip() for c in line.strip("|").split("|")]


def test_a_fast_spell_at_1x_in_one_round_does_not_make_the_slope() -> None:
    """A 1x run that caught a fast spell (half the time, once) makes the fastest runs'
    slope 1.25; each round's slope is 1.0 but that one's, and their median passes."""
    points = _row([(1.0, 4.0, 16.0), (0.5, 4.0, 16.0), (1.0, 4.0, 16.0)])
    assert slope(points) == pytest.approx(1.25)
    cells = _cells(render({"verify": points}, [1, 4, 16]), "verify")
    assert cells[5:8] == ["1.00", "1.00x", "1.25"]  # slope, t(16x) / linear, fastest: slope
    assert cells[-1] == "PASS"


def test_a_row_that_grows_too_fast_in_most_rounds_misses() -> None:
    points = _row([(1.0, 4.4, 20.0), (1.0, 4.0, 16.0), (0.9, 4.4, 19.0)])
    cells = _cells(render({"push": points}, [1, 4, 16]), "push")
    assert float(cells[5]) > 1.05 and cells[-1] == "MISS"
    assert "push: each round's slope" in render({"push": points}, [1, 4, 16])


def test_a_rounds_runs_of_one_size_are_averaged_geometrically() -> None:
    t = Trial("gc", 1, "gc", {}, 10, {})
    t.runs = [
        {"seconds": s, "maxrss_kib": 1024, "anon_kib": 512, "round": r}
        for s, r in [(1.0, 0), (4.0, 0), (3.0, 1), (3.0, 1)]
    ]
    m = t.measure()
    assert m.seconds == 1.0 and m.rounds == [pytest.approx(2.0), pytest.approx(3.0)]
    assert math.isclose(m.maxrss, 1.0) and math.isclose(m.anon, 0.5)


def test_the_most_major_faults_of_a_size_are_printed_under_the_table() -> None:
    """Pages the kernel took back from the cache and a run read again from the disk cost a
    large store's run more than the code does: each size's most, printed per row."""
    trials = []
    for f, faults in ((1, [0, 3]), (4, [7, 2]), (16, [1_593, 40])):
        t = Trial("push", f, "push", {}, 10 * f, {})
        t.runs = [
            {"seconds": f * 1.0, "maxrss_kib": 1024, "anon_kib": 512, "round": 0, "majflt": n}
            for n in faults
        ]
        trials.append(t.measure())
    assert [m.majflt for m in trials] == [3, 7, 1_593]
    text = render({"push": trials}, [1, 4, 16])
    assert "major page faults, the most in one run, at each size:\npush: 3 / 7 / 1,593" in text
    quiet = render({"push": _row([(1.0, 4.0, 16.0)])}, [1, 4, 16])
    assert "major page faults" not in quiet


def _trials(cpu: list[float], unlocked: str | None = None) -> list[Measure]:
    out = []
    for f, c in zip((1, 4, 16), cpu, strict=True):
        t = Trial("verify", f, "verify", {}, 1_000 * f, {})
        t.runs = [
            {"seconds": f * 1.3, "cpu": c, "maxrss_kib": 1024, "anon_kib": 512, "round": 0},
            {
                "seconds": f * 1.3,
                "cpu": c,
                "maxrss_kib": 1024,
                "anon_kib": 512,
                "round": 0,
                "unlocked": unlocked if f == 16 else None,
            },
        ]
        out.append(t.measure())
    return out


def test_the_slope_of_the_time_on_the_cpu_is_printed_under_the_table() -> None:
    """The wall time's slope is 1.0; the CPU's (16 x 1.1 the 1x's at 16x) 1.03: what the
    run waited for and what it computed, told apart."""
    text = render({"verify": _trials([1.0, 4.0, 17.6])}, [1, 4, 16])
    assert _cells(text, "verify")[5] == "1.00"
    assert "slope of the time on the CPU (user + system, rounds' median): verify 1.03" in text
    assert "not locked" not in text


def test_runs_whose_files_were_not_locked_are_named_with_the_reason() -> None:
    text = render({"verify": _trials([1.0, 4.0, 16.0], "mlock x: refused")}, [1, 4, 16])
    assert "files not locked in memory during a run (read before it instead):" in text
    assert "verify 16,000: mlock x: refused" in text
