"""`swerl plan`: the architecture's numbers, the memory model, the recipe's placement, refusals with numbers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from swerl.cli import main
from swerl.config import load_config
from swerl.doctor import plan_checks
from swerl.plan import make_plan
from swerl.plan.architecture import ARCHITECTURES, PlanError, architecture_from_hf, load_architecture
from swerl.plan.memory import trainer_memory
from swerl.plan.report import GIB

REPO = Path(__file__).resolve().parents[2]
RECIPE = str(REPO / "configs" / "qwen3-30b-a3b.yaml")
LOCAL = str(REPO / "configs" / "local.yaml")
QWEN3_30B = json.loads((ARCHITECTURES / "qwen3-30b-a3b.json").read_text())


def _recipe(*overrides: str):
    return load_config(RECIPE, list(overrides))


def test_kv_cache_of_qwen3_30b_a3b_at_64k_tokens() -> None:
    """48 layers x 4 KV heads x 128 x 2 (K, V) x 2 B (bf16) = 98,304 B per token; 65,536 tokens = 6.44 GB.

    The recipe's 6.3 GB is decimal GB: 6.44e9 B is 2.3% from 6.3e9 (in GiB it is 6.00, 4.8% off 6.3), and the same
    formula at 64,000 tokens gives 6.29e9 B, which is the recipe's figure rounded."""
    arch = architecture_from_hf(QWEN3_30B, "shipped")
    per_token = arch.kv_bytes_per_token(2)
    assert per_token == 48 * 4 * 128 * 2 * 2 == 98_304
    trajectory = per_token * 65_536
    assert trajectory == 6_442_450_944
    assert abs(trajectory - 6.3e9) / 6.3e9 < 0.05
    assert trajectory / GIB == 6.0
    assert round(per_token * 64_000 / 1e9, 1) == 6.3


def test_parameters_of_qwen3_30b_a3b_from_its_config() -> None:
    """~30.5 B total and ~3.3 B active, exactly what transformers builds from the same config (meta device)."""
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    params = architecture_from_hf(QWEN3_30B, "shipped").params()
    assert params.total == 30_532_122_624
    assert params.active == 3_353_032_704
    assert params.experts == 48 * 128 * 3 * 2048 * 768
    assert round(params.total / 1e9, 1) == 30.5 and 3.3 <= params.active / 1e9 < 3.4  # "30.5B total, 3.3B activated"
    fields = {key: value for key, value in QWEN3_30B.items() if not key.startswith("_")}
    with torch.device("meta"):
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**fields))
    assert sum(p.numel() for p in model.parameters()) == params.total


def test_parameters_of_a_dense_tied_qwen3_match_transformers() -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    fields = dict(
        model_type="qwen3",
        hidden_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=768,
        vocab_size=1000,
        tie_word_embeddings=True,
    )
    arch = architecture_from_hf(fields, "test")
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**{k: v for k, v in fields.items() if k != "model_type"}))
    assert sum(p.numel() for p in model.parameters()) == arch.params().total == arch.params().active


def test_fsdp2_sharding_halves_per_rank_state_when_ranks_double() -> None:
    arch = load_architecture(_recipe())
    eight = trainer_memory(arch, _recipe(), "grpo")
    sixteen = trainer_memory(arch, _recipe("grpo.distributed.ranks=16"), "grpo")
    for item in ("weights", "grads", "optimizer"):
        assert abs(sixteen[item] * 2 - eight[item]) <= 2, item
    for item in ("gathered", "activations", "logits"):  # per rank, whatever the ranks
        assert sixteen[item] == eight[item], item
    # the sharded state: 16 bytes per parameter over the ranks (fp32 master, gradient, two AdamW moments)
    total = arch.params().total
    assert abs(eight["weights"] + eight["grads"] + eight["optimizer"] - 16 * total / 8) <= 3


def test_recipe_plans_cleanly_and_prints_memory_per_gpu() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "swerl.cli", "plan", RECIPE],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "memory per GPU:" in out and out.rstrip().endswith("plan: ok")
    assert "node 0 GPU 0-7: engines 0-7 (sglang, 1 GPU each)" in out
    assert "node 1 GPU 0-7: trainer ranks 0-7" in out
    assert re.search(r"node 0 GPU 0-7 \(engines 0-7; each GPU\): weights 56\.9 GiB \+ KV .* 96\.0 GiB", out)
    assert re.search(r"node 1 GPU 0-7 \(grpo fsdp2 ranks 0-7.*\): weights .* = \d+\.\d GiB of 241\.2 GiB", out)
    assert "98,304 B" in out and "6.44 GB (6.0 GiB) per trajectory" in out


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["cluster.nodes=3", "cluster.engine_nodes=2", "engine.launch.num_engines=16"],
        ["cluster.nodes=4", "cluster.engine_nodes=3", "engine.launch.num_engines=24"],
        ["cluster.nodes=3", "sft.distributed.ranks=16", "grpo.distributed.ranks=16"],
        [
            "grpo.distributed.backend=megatron",
            "grpo.distributed.megatron.expert_parallel=8",
            "grpo.distributed.megatron.recompute=full",
        ],
    ],
    ids=["2 nodes", "3 nodes: 16 engines", "4 nodes: 24 engines", "3 nodes: 16 trainer ranks", "megatron EP 8"],
)
def test_recipe_plans_cleanly_on_2_to_4_nodes(overrides: list[str]) -> None:
    plan = make_plan(_recipe(*overrides))
    assert plan.ok, plan.text()
    nodes = _recipe(*overrides).cluster.nodes
    placed = "\n".join(plan.placement)
    assert all(f"node {n} GPU 0-7" in placed for n in range(nodes)), placed


def test_an_oversubscribed_engine_gpu_is_refused_with_the_gpu_and_the_shortfall(capsys) -> None:
    """64 x 64K trajectories per engine on 80 GiB GPUs: 384 GiB of KV + 56.9 GiB of weights vs 64 GiB."""
    code = main(["plan", RECIPE, "--set", "engine.max_batch_size=64", "--set", "cluster.gpu_memory_gib=80"])
    out = capsys.readouterr().out
    assert code == 1
    assert re.search(
        r"FAIL memory\.engines\.node0: node 0 GPU 0-7 \(engines 0-7; each GPU\) needs 440\.9 GiB but has 64\.0 GiB "
        r"\(80 GiB x 0\.8, engine\.sglang\.mem_fraction_static\): 376\.9 GiB short",
        out,
    ), out
    assert "memory.sft.node1: node 1 GPU 0-7" in out and "plan: refused:" in out


def test_one_node_for_everything_is_short_of_gpus(capsys) -> None:
    assert main(["plan", RECIPE, "--set", "cluster.nodes=1", "--set", "cluster.engine_nodes=null"]) == 1
    out = capsys.readouterr().out
    assert "FAIL gpus: the cluster has 8 GPUs (1 node x 8); engines 8 (8 x 1 GPU) and the trainer 8" in out
    assert "8 GPUs short" in out


def test_ranks_must_equal_the_trainer_gpus() -> None:
    plan = make_plan(_recipe("cluster.nodes=3"))
    failed = {c.name: c.detail for c in plan.failed}
    assert set(failed) == {"ranks.sft", "ranks.grpo"}
    assert "grpo.distributed.ranks 8 vs 16 trainer GPUs (node 1 GPU 0-7, node 2 GPU 0-7)" in failed["ranks.grpo"]


def test_engines_must_fit_their_nodes() -> None:
    plan = make_plan(_recipe("engine.launch.num_engines=12"))
    failed = {c.name: c.detail for c in plan.failed}
    assert "12 engines x 1 GPU = 12 GPUs in cluster.engine_nodes 1 x 8 GPUs (8): 4 GPUs short" in failed["engines"]


def test_a_missing_model_config_is_a_clear_error(capsys) -> None:
    assert main(["plan", RECIPE, "--set", "cluster.model_config=null"]) == 2
    err = capsys.readouterr().err
    assert "sft.model_path /models/Qwen3-30B-A3B-Instruct-2507 has no config.json here" in err
    assert "cluster.model_config is not set" in err and "qwen3-30b-a3b" in err
    with pytest.raises(PlanError, match="'nope' is neither a file nor a shipped architecture"):
        make_plan(_recipe("cluster.model_config=nope"))


def test_a_config_json_lacking_a_number_names_it(tmp_path: Path) -> None:
    broken = {key: value for key, value in QWEN3_30B.items() if key != "num_hidden_layers"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(broken))
    with pytest.raises(PlanError, match="lacks 'num_hidden_layers'"):
        make_plan(_recipe(f"cluster.model_config={path}"))


def test_the_model_folder_s_own_config_comes_first(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**QWEN3_30B, "num_hidden_layers": 24}))
    arch = load_architecture(_recipe(f"sft.model_path={model}"))
    assert arch.num_layers == 24 and arch.source.endswith("model/config.json")


def test_the_cpu_default_plans_cleanly(capsys) -> None:
    assert main(["plan", LOCAL]) == 0
    out = capsys.readouterr().out
    assert "no GPU (cluster.gpus_per_node is 0)" in out and "this machine (" in out
    assert "from sft.tiny" in out and out.rstrip().endswith("plan: ok")


def test_gpu_work_on_a_cpu_machine_is_refused() -> None:
    plan = make_plan(load_config(LOCAL, ["engine.kind=sglang", "grpo.distributed.device=cuda"]))
    failed = {c.name: c.detail for c in plan.failed}
    assert failed == {
        "gpus": "engine.kind sglang and grpo.distributed.device cuda need GPUs, but cluster.gpus_per_node is 0"
    }


def test_doctor_lists_the_plan_s_checks() -> None:
    ok = plan_checks(load_config(LOCAL))
    assert ok and all(c.ok and c.name.startswith("plan.") for c in ok)
    refused = plan_checks(load_config(LOCAL, ["engine.kind=sglang"]))
    assert [c.name for c in refused if not c.ok] == ["plan.gpus"]
    missing = plan_checks(_recipe("cluster.model_config=null"))
    assert [(c.name, c.ok) for c in missing] == [("plan", False)]


def test_run_refuses_an_impossible_plan_before_any_stage(tmp_path: Path, capsys, monkeypatch) -> None:
    import swerl.cli as cli

    started: list[bool] = []
    monkeypatch.setattr(cli, "_prefect_env", lambda: started.append(True))
    store = tmp_path / "store"
    over = [
        "--set",
        f"storage.root=file://{store}",
        "--set",
        f"tracking.uri=sqlite:///{tmp_path}/mlflow.db",
        "--set",
        "engine.kind=sglang",
        "--ignore-doctor",
    ]
    assert main(["run", LOCAL, *over]) == 1
    err = capsys.readouterr().err
    assert "swerl run: swerl plan refuses this config:" in err
    assert "gpus: engine.kind sglang needs GPUs, but cluster.gpus_per_node is 0" in err
    assert started == []  # neither Prefect nor any stage started
    assert not store.exists() or not list(store.rglob("manifest*")), list(store.rglob("*"))


def test_run_checks_every_grpo_phase_as_it_runs(tmp_path: Path, capsys, monkeypatch) -> None:
    """A phase that changes the engine is planned with its engine: the refusal names that phase only."""
    import swerl.cli as cli

    started: list[bool] = []
    monkeypatch.setattr(cli, "_prefect_env", lambda: started.append(True))
    phases = "grpo.phases=[{name: a, steps: 1}, {name: b, steps: 1, engine: {kind: sglang}}]"
    over = ["--set", f"storage.root=file://{tmp_path}/store", "--set", phases, "--ignore-doctor"]
    assert main(["run", LOCAL, *over]) == 1
    err = capsys.readouterr().err
    assert "gpus: engine.kind sglang needs GPUs, but cluster.gpus_per_node is 0" in err
    assert "(GRPO phase grpo-b)" in err and "grpo-a" not in err, err
    assert started == []
    # `swerl plan` shows each phase's placement
    assert main(["plan", LOCAL, "--set", phases]) == 1
    out = capsys.readouterr().out
    assert "== GRPO phase grpo-a" in out and "== GRPO phase grpo-b" in out


def test_a_check_every_phase_fails_is_said_once_and_one_phase_fails_names_it() -> None:
    from swerl.cli import by_phase

    found = {
        "grpo-a": {"memory": "memory: 16384 MB vs 15476 MB available"},
        "grpo-b": {"memory": "memory: 16384 MB vs 15470 MB available", "files": "files: 9000 > 1024"},
    }
    assert by_phase(found) == [
        "memory: 16384 MB vs 15476 MB available",
        "files: 9000 > 1024 (GRPO phase grpo-b)",
    ]
    assert by_phase({"grpo": {}}) == []
