"""Server profiles: presets, base overlays, validation errors naming the YAML path; GB300 figures."""

from __future__ import annotations

import pytest

from simulator.errors import InputError
from simulator.sim.profile import load_profile, preset_names
from simulator.sim.shapes import fixed_shape_throughput

GB300_PUBLISHED = {
    "gb300-nemotron-super-default": 6058,
    "gb300-nemotron-super-mtp3": 7000,
    "gb300-nemotron-super-async-fi": 7800,
    "gb300-nemotron-super-mtp1": 9500,
    "gb300-nemotron-super-fp16-state": 11840,
}


def test_presets_load_and_tiny_is_calibrated():
    names = preset_names()
    assert "tiny-vllm-cpu" in names and set(GB300_PUBLISHED) <= set(names)
    tiny = load_profile("tiny-vllm-cpu")
    assert tiny.calibrated
    # 1 GiB of fp32 KV (4 KiB a token) in the CPU backend's 128-token blocks
    assert tiny.kv_cache.capacity_blocks == 2**30 // (4096 * 128)


def test_overlays_change_only_what_they_name():
    base = load_profile("gb300-nemotron-super-default")
    step = load_profile("gb300-nemotron-super-async-fi")
    assert step.scheduler.async_scheduling and not base.scheduler.async_scheduling
    assert step.spec_decode.num_tokens == 3  # inherited from the MTP-3 step
    assert step.step_time.fixed == base.step_time.fixed
    assert step.step_time.per_decode_seq < base.step_time.per_decode_seq
    assert step.name == "gb300-nemotron-super-async-fi"


def test_profile_file_with_base_and_overrides(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("base: tiny-vllm-cpu\nname: mine\nscheduler:\n  max_num_seqs: 8\n")
    profile = load_profile(path, overrides={"kv_cache": {"num_blocks": 5000}})
    assert profile.scheduler.max_num_seqs == 8 and profile.scheduler.max_num_batched_tokens == 2048
    assert profile.kv_cache.capacity_blocks == 5000


@pytest.mark.parametrize("text, where", [
    ("base: tiny-vllm-cpu\nscheduler:\n  max_num_seq: 8\n", "scheduler.max_num_seq"),
    ("base: tiny-vllm-cpu\nstep_time:\n  fixed: -1\n", "step_time.fixed"),
    ("base: tiny-vllm-cpu\nspec_decode:\n  acceptance: 1.5\n", "spec_decode.acceptance"),
    ("kv_cache:\n  block_size: 16\n", "kv_cache"),
])
def test_bad_profile_names_file_and_yaml_path(tmp_path, text, where):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_profile(path)
    assert str(path) in str(info.value) and f"at {where}" in str(info.value)


def test_unknown_preset_and_base_loop_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="no profile file or preset"):
        load_profile("no-such-profile")
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(InputError, match="loops"):
        load_profile(tmp_path / "a.yaml")


def test_kv_cache_must_hold_max_model_len(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text("base: tiny-vllm-cpu\nkv_cache:\n  num_blocks: 10\n  memory_bytes: null\n")
    with pytest.raises(InputError, match="max_model_len"):
        load_profile(path)


@pytest.mark.parametrize("name, published", sorted(GB300_PUBLISHED.items()))
def test_gb300_presets_reproduce_published_throughput_within_5_percent(name, published):
    result = fixed_shape_throughput(load_profile(name), concurrency=256, input_tokens=512, output_tokens=512)
    assert result.requests == 256 * 8
    assert abs(result.output_tokens_per_s / published - 1) <= 0.05
