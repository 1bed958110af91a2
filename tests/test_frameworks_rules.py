"""Rules the framework support rests on, without a capture: Megatron's group families and fused-softmax stand-ins.

* Megatron-LM's ``parallel_state.initialize_model_parallel`` makes each pipeline group followed by
  its embedding and position-embedding groups (megatron/core/parallel_state.py, core_v0.13), after
  the tensor-parallel groups of the same size: the pipeline family is the groups made from rank 0's
  on, skipping those inside it, not every group of that size (``roles._family_of``).
* apex's fused softmax kernels (csrc/megatron/scaled_masked_softmax_cuda.cu): ``fwd_cuda`` returns
  one ``torch::empty`` of the input's shape and dtype, ``bwd_cuda`` works in place on
  ``output_grads.contiguous()``; ``get_batch_per_block`` (scaled_masked_softmax.h): 128 threads a
  block, warps of ``min(next_pow2(keys), 32)`` threads, 2 rows a warp up to 128 keys.
"""

from __future__ import annotations

import pytest

from allocsim.torch_capture.distributed.roles import JobFacts, assign_roles


def test_megatron_pipeline_family_is_found_among_same_size_groups():
    # tp 2 x pp 2 x dp 2 in Megatron's creation order (tp groups, then each pp group with its embedding groups)
    groups = [[0, 2], [1, 3], [4, 6], [5, 7], [0, 1], [2, 3], [4, 5], [6, 7],
              [0, 4], [0, 4], [0], [1, 5], [1, 5], [1], [2, 6], [2, 6], [2], [3, 7], [3, 7], [3]]
    facts = JobFacts()
    facts.add({"fact": "world", "rank": 0, "world_size": 8, "backend": "nccl"})
    for g in groups:
        facts.add({"fact": "group", "ranks": g})
    facts.add({"fact": "stage", "stage_index": 0, "num_stages": 2, "group_ranks": [0, 4]})
    roles, _ = assign_roles(facts, 8)
    assert [r.ranks for r in roles] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_fused_softmax_stand_ins_allocate_what_the_kernels_allocate():
    torch = pytest.importorskip("torch")
    from allocsim.torch_capture.distributed.megatron import get_batch_per_block, softmax_stand_ins

    module = softmax_stand_ins()["scaled_masked_softmax_cuda"]
    x = torch.empty(2, 4, 16, 16, dtype=torch.bfloat16, device="meta")
    out = module.forward(x, torch.empty(2, 1, 16, 16, dtype=torch.bool, device="meta"), 1.0)
    assert out.shape == x.shape and out.dtype == x.dtype and out.untyped_storage() is not x.untyped_storage()
    grads = torch.empty(2, 4, 16, 16, dtype=torch.bfloat16, device="meta")
    assert module.backward(grads, out, 1.0) is grads                    # in place, no new tensor
    assert [get_batch_per_block(k, k, 8, 4) for k in (16, 128, 256, 2048)] == [16, 8, 4, 4]


# ------------------------------------------------------------------------------------------ framework knobs
def test_deepspeed_knobs_are_the_next_stages_then_offload(tmp_path):
    import json

    from allocsim.framework_knobs import deepspeed_candidates

    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"bf16": {"enabled": True}, "zero_optimization": {"stage": 1}}))
    command = ["deepspeed", "--num_gpus", "8", "t.py", "--deepspeed", "--deepspeed_config", str(config)]
    found = deepspeed_candidates(command, str(tmp_path))
    assert [c.label for c in found] == ["ZeRO stage 2", "ZeRO stage 3", "ZeRO stage 2 with the optimizer on the CPU",
                                        "ZeRO stage 3 with optimizer and parameters on the CPU"]
    written = json.loads(open(found[2].command[-1]).read())
    assert written["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert written["bf16"] == {"enabled": True} and json.loads(config.read_text())["zero_optimization"] == {"stage": 1}
    assert found[0].paste == '"zero_optimization": {"stage": 2}'


def test_megatron_knobs_recompute_then_splits_the_world_allows():
    from allocsim.framework_knobs import megatron_candidates

    command = ["torchrun", "--nproc-per-node", "8", "pretrain_gpt.py", "--num-layers", "6", "--num-attention-heads",
               "12", "--micro-batch-size", "1", "--global-batch-size", "8", "--tensor-model-parallel-size", "2"]
    found = megatron_candidates(command, world_size=8, ranks_per_node=8)
    labels = [c.label for c in found]
    assert labels[:3] == ["selective recompute", "full recompute", "distributed optimizer"]
    # tp must divide 12 heads and stay in a node, pp must divide 6 layers, more model parallel than tp 2 x pp 1
    # (t, p) with t in {1, 2, 4} (dividing 12, within a node), p in {1, 2} (dividing 6 and the world), t x p > 2,
    # fewest model-parallel ranks first, then the shallower pipeline
    assert labels[3:] == ["tensor parallel 4 x pipeline parallel 1", "tensor parallel 2 x pipeline parallel 2",
                          "tensor parallel 4 x pipeline parallel 2"]
    for c in found[3:]:
        t = int(c.command[c.command.index("--tensor-model-parallel-size") + 1])
        p = int(c.command[c.command.index("--pipeline-model-parallel-size") + 1]) \
            if "--pipeline-model-parallel-size" in c.command else 1
        assert 12 % t == 0 and 6 % p == 0 and 8 % (t * p) == 0 and t * p > 2
