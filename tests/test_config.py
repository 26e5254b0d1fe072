import dataclasses

import pytest

from harness.config import PRESETS, ModelConfig, get_config


def test_published_presets():
    expected = {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
                "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32)}
    for name, dims in expected.items():
        c = get_config(name)
        assert (c.d_model, c.d_ff, c.num_layers, c.num_heads) == dims
        assert (c.vocab_size, c.rope_theta, c.attention) == (10_000, 10_000.0, "naive")


def test_param_count_of_small_matches_hand_count():
    c = get_config("small")
    per_layer = 4 * 768 * 768 + 3 * 768 * 3072 + 2 * 768
    assert c.num_params == 2 * 10_000 * 768 + 12 * per_layer + 768


def test_config_is_frozen_and_overridable():
    c = get_config("tiny", attention="fused")
    assert c.attention == "fused" and c.name == "tiny"
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 3


@pytest.mark.parametrize("call, message", [
    (lambda: get_config("huge"), "unknown model 'huge'; choose one of tiny"),
    (lambda: get_config("tiny", attention="flash"), "unknown attention 'flash'; choose one of naive, fused, pallas"),
    (lambda: get_config("tiny", d_mdl=3), "unknown config field(s) ['d_mdl']"),
    (lambda: ModelConfig(d_model=100, num_heads=3), "d_model=100 must be divisible by num_heads=3"),
])
def test_bad_config_names_the_fix(call, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[",
                                                                                                 r"\[").replace("]",
                                                                                                                r"\]")):
        call()


def test_cpu_presets_fit_the_pallas_kernel():
    for name in ("tiny", "mini"):
        assert get_config(name).d_head == 64
    assert set(PRESETS) >= {"tiny", "small", "medium", "large", "xl", "2.7B"}
