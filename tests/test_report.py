"""The lines evaluate.py writes for people (mtlc/report.py)."""
from mtlc.report import describe_lc

LC_DIAGNOSTICS = dict(eps=2.0, eps_auto=True, eps_scale="relative", max_neighbour_fraction_after_ramp=0.1,
                      d2_ratio_start=0.5, d2_ratio_end=0.4)


def test_the_space_is_said_to_shrink_or_grow_as_it_did():
    """LC's control often ends with a larger space than it started with: '0.6x smaller' would mislead."""
    shrunk = describe_lc(dict(LC_DIAGNOSTICS, d2_mean_start=5.0, d2_mean_end=2.0))
    grown = describe_lc(dict(LC_DIAGNOSTICS, d2_mean_start=0.293, d2_mean_end=0.476))
    assert "mean d2 5 -> 2 (2.5x smaller)" in shrunk
    assert "mean d2 0.293 -> 0.476 (1.6x larger)" in grown and "smaller" not in grown
