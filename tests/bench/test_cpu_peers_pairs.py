"""bench.cpu_peers pairs each round's two sides: the paired ratio is the median of the
rounds' own ratios, which a drift of the machine between rounds moves less than the
ratio of the sides' medians; rounds without a rate (a skipped one-stream decode) pair
nothing."""

from __future__ import annotations

from bench.cpu_peers import add_pairs, summarise


def test_each_round_is_paired_with_its_own_peer_run():
    paired: dict[str, list[float]] = {}
    # the machine slows down between rounds 1 and 2, both sides alike
    add_pairs(paired, {"ours": 150.0, "openvino": 100.0, "ours_single": 30.0,
                       "openvino_single": 20.0})
    add_pairs(paired, {"ours": 75.0, "openvino": 50.0, "ours_single": None,
                       "openvino_single": 10.0})
    add_pairs(paired, {"ours": 120.0, "openvino": 100.0, "ours_single": 24.0,
                       "openvino_single": 20.0})
    assert paired == {"ours/openvino": [1.5, 1.5, 1.2], "ours_single/openvino_single": [1.5, 1.2]}
    runs = {"ours": [150.0, 75.0, 120.0], "openvino": [100.0, 50.0, 100.0],
            "ours_single": [30.0, 24.0], "openvino_single": [20.0, 10.0, 20.0]}
    result = summarise(runs, None, paired)
    assert result["ratios"]["ours/openvino"] == 1.2  # 120 / 100: the medians
    assert result["paired"]["ours/openvino"] == {"median": 1.5, "min": 1.2, "max": 1.5, "n": 3}
    assert result["paired"]["ours_single/openvino_single"]["n"] == 2


def test_without_the_peer_nothing_is_paired():
    result = summarise({"ours": [100.0], "ours_single": [20.0]}, "no peer venv", {})
    assert result["ratios"] == {} and result["paired"] == {}
