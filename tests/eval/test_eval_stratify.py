"""Stratified subsets: allocation sums and proportionality (against exact quotas), seeded determinism, the
difficulty fallback, and clear refusals."""

from __future__ import annotations

import itertools
import json
import logging
import random
from fractions import Fraction
from pathlib import Path

import pytest

from swerl.data.schema import TaskInstance
from swerl.eval.stratify import DIFFICULTY_BUCKETS, Subset, SubsetError, largest_remainder, stratify


def task(i: int, repo: str, difficulty: str | None) -> TaskInstance:
    return TaskInstance(
        instance_id=f"{repo.replace('/', '__')}-{i}",
        repo=repo,
        base_commit="c" * 40,
        problem_statement="p",
        patch="diff",
        patch_kind="fix",
        FAIL_TO_PASS=["t::a"],
        difficulty=difficulty,
        source="test",
    )


def swebench_like(seed: int = 0) -> list[TaskInstance]:
    rng = random.Random(seed)
    repos = {"django/django": 231, "sympy/sympy": 75, "sphinx-doc/sphinx": 44, "pallets/flask": 1}
    out = []
    for repo, count in repos.items():
        for i in range(count):
            out.append(task(i, repo, rng.choices(DIFFICULTY_BUCKETS, weights=[39, 52, 8, 1])[0]))
    return out


def test_largest_remainder_sums_to_n_and_stays_within_one_of_the_exact_quota() -> None:
    rng = random.Random(0)
    for _ in range(300):
        sizes = {f"s{i}": rng.randint(1, 50) for i in range(rng.randint(1, 12))}
        total = sum(sizes.values())
        n = rng.randint(0, total)
        shares = largest_remainder(sizes, n)
        assert sum(shares.values()) == n
        for k, size in sizes.items():
            quota = Fraction(n * size, total)
            assert int(quota) <= shares[k] <= min(size, int(quota) + 1), (sizes, n, shares)
        # Hamilton's property: a stratum rounded up never has a smaller remainder than one rounded down.
        up = [
            Fraction(n * sizes[k], total) - int(Fraction(n * sizes[k], total))
            for k in sizes
            if shares[k] > int(Fraction(n * sizes[k], total))
        ]
        down = [
            Fraction(n * sizes[k], total) - int(Fraction(n * sizes[k], total))
            for k in sizes
            if shares[k] == int(Fraction(n * sizes[k], total))
        ]
        assert not up or not down or min(up) >= max(down)


def test_largest_remainder_on_literal_cases() -> None:
    # quotas 10*5/10=5, 10*3/10=3, 10*2/10=2: exact.
    assert largest_remainder({"a": 5, "b": 3, "c": 2}, 10) == {"a": 5, "b": 3, "c": 2}
    # quotas 7 * (5, 3, 2)/10 = 3.5, 2.1, 1.4: floors 3, 2, 1 (6); the last seat goes to a (0.5 > 0.4 > 0.1).
    assert largest_remainder({"a": 5, "b": 3, "c": 2}, 7) == {"a": 4, "b": 2, "c": 1}
    # ties broken by name, not by dict order
    assert largest_remainder({"b": 1, "a": 1}, 1) == {"a": 1, "b": 0}
    assert largest_remainder({"a": 1, "b": 1}, 1) == {"a": 1, "b": 0}


def test_refusals_are_clear() -> None:
    with pytest.raises(SubsetError, match=r"subset size 11 is larger than the dataset \(10 tasks\)"):
        largest_remainder({"a": 5, "b": 5}, 11)
    with pytest.raises(SubsetError, match=r"no tasks: \['b'\]"):
        largest_remainder({"a": 5, "b": 0}, 3)
    with pytest.raises(SubsetError, match="larger than the dataset"):
        stratify(swebench_like(), 1000, seed=0)


def test_stratify_is_proportional_deterministic_by_seed_and_independent_of_row_order() -> None:
    tasks = swebench_like()
    subset = stratify(tasks, 100, seed=3)
    assert len(subset.instance_ids) == len(set(subset.instance_ids)) == 100
    # flask's single task is too small a stratum for a share of 100: named, not silently dropped
    assert subset.by_difficulty and subset.note == (
        "1 stratum/strata too small for a share of 100 tasks: ['pallets/flask | 15 min - 1 hour']"
    )
    assert sum(len(v) for v in subset.strata.values()) == 100
    assert sum(subset.population.values()) == len(tasks)
    shares = largest_remainder(subset.population, 100)
    assert {k: len(v) for k, v in subset.strata.items()} == shares
    by_id = {t.instance_id: t for t in tasks}
    for name, ids in subset.strata.items():
        assert all(f"{by_id[i].repo_key} | {by_id[i].difficulty}" == name for i in ids)
    # django has 231 of 351 tasks: its share of 100 is 65 or 66.
    django = sum(len(v) for k, v in subset.strata.items() if k.startswith("django/django"))
    assert abs(django - 100 * 231 / 351) <= 4  # one seat of rounding per django stratum at most

    shuffled = list(tasks)
    random.Random(9).shuffle(shuffled)
    assert stratify(shuffled, 100, seed=3).instance_ids == subset.instance_ids
    assert stratify(tasks, 100, seed=4).instance_ids != subset.instance_ids
    again = Subset.from_json(subset.to_json())
    assert again == subset and again.select(shuffled) == [by_id[i] for i in subset.instance_ids]


def test_every_task_is_equally_likely_within_its_stratum() -> None:
    tasks = [task(i, "a/a", "<15 min fix") for i in range(4)] + [task(i, "b/b", "<15 min fix") for i in range(2)]
    counts = {t.instance_id: 0 for t in tasks}
    for seed in range(2000):
        for i in stratify(tasks, 3, seed).instance_ids:
            counts[i] += 1
    # shares: a gets 2 of 4 (p = 1/2), b gets 1 of 2 (p = 1/2)
    assert all(abs(c / 2000 - 0.5) < 0.05 for c in counts.values()), counts


def test_a_dataset_without_difficulty_falls_back_to_repositories_and_says_so() -> None:
    tasks = [task(i, repo, None) for repo, n in (("a/a", 6), ("b/b", 3)) for i in range(n)]
    subset = stratify(tasks, 3, seed=0)
    assert not subset.by_difficulty
    assert "no difficulty labels" in subset.note and "repositories only" in subset.note
    assert {k: len(v) for k, v in subset.strata.items()} == {"a/a": 2, "b/b": 1}

    mixed = [*tasks, task(99, "c/c", "1-4 hours"), task(98, "c/c", "weird")]
    subset = stratify(mixed, 11, seed=0)
    assert subset.by_difficulty and "9 task(s) have no difficulty label" in subset.note
    assert "a/a | unlabeled" in subset.strata and "outside SWE-bench Verified's buckets" in subset.note


def test_a_saved_subset_refuses_another_dataset() -> None:
    subset = stratify(swebench_like(), 10, seed=0)
    with pytest.raises(SubsetError, match="not in the dataset"):
        subset.select(swebench_like()[:5])


def test_strata_too_small_for_a_share_are_named() -> None:
    tasks = [task(i, "a/a", None) for i in range(20)] + [task(0, "z/z", None)]
    subset = stratify(tasks, 5, seed=1)
    assert subset.strata["z/z"] == [] and "z/z" in subset.note
    assert list(itertools.chain(*subset.strata.values())) and len(subset.instance_ids) == 5


def write_swebench_rows(path: Path, with_difficulty: bool) -> None:
    """Rows in SWE-bench Verified's published schema (test lists as JSON strings, as the hub serves them)."""
    rows = []
    buckets = list(DIFFICULTY_BUCKETS)
    for repo, count in (("django/django", 12), ("sympy/sympy", 6), ("psf/requests", 2)):
        for i in range(count):
            row = {
                "repo": repo,
                "instance_id": f"{repo.replace('/', '__')}-{1000 + i}",
                "base_commit": "f" * 40,
                "patch": "diff --git a/x.py b/x.py\n",
                "test_patch": "diff --git a/t.py b/t.py\n",
                "problem_statement": f"issue {i} of {repo}",
                "hints_text": "",
                "created_at": "2020-01-01T00:00:00Z",
                "version": "3.0",
                "FAIL_TO_PASS": json.dumps([f"tests/test_{i}.py::test_fix"]),
                "PASS_TO_PASS": json.dumps([f"tests/test_{i}.py::test_keep"]),
                "environment_setup_commit": "e" * 40,
            }
            if with_difficulty:
                row["difficulty"] = buckets[i % 2] if repo != "psf/requests" else ">4 hours"
            rows.append(row)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_swe_bench_verified_rows_through_datasets_are_stratified_by_repo_and_difficulty(
    tmp_path: Path, suffix: str
) -> None:
    from swerl.data.loaders import load_tasks

    path = tmp_path / f"verified{suffix}"
    write_swebench_rows(path, with_difficulty=True)
    tasks, report = load_tasks(str(path), "swebench", split="test")
    assert report.accepted == 20 and not report.rejected
    subset = stratify(tasks, 10, seed=0)
    assert subset.by_difficulty and subset.note == ""
    # quotas 3, 3, 1, 1.5, 1.5: the one seat left goes to the tied sympy stratum whose name sorts first
    assert {k: len(v) for k, v in subset.strata.items()} == {
        "django/django | 15 min - 1 hour": 3,
        "django/django | <15 min fix": 3,
        "psf/requests | >4 hours": 1,
        "sympy/sympy | 15 min - 1 hour": 2,
        "sympy/sympy | <15 min fix": 1,
    }


def test_the_stage_draws_from_evaluate_dataset_and_falls_back_without_labels(tmp_path: Path) -> None:
    from swerl.config.data import DatasetSource
    from swerl.config.evaluate import EvaluateConfig
    from swerl.stages.evaluate import evaluation_tasks, load_or_draw_subset
    from swerl.stages.runner import StageContext
    from swerl.storage import Store

    path = tmp_path / "unlabeled.jsonl"
    write_swebench_rows(path, with_difficulty=False)
    store = Store(f"file://{tmp_path}/store")
    ctx = StageContext(
        stage="evaluate",
        store=store,
        prefix="p",
        workdir=tmp_path,
        inputs={},
        run=None,  # type: ignore[arg-type]
        log=logging.getLogger("test"),
    )
    cfg = EvaluateConfig(max_tasks=5, dataset=DatasetSource(schema="swebench", path=str(path), split="test"))
    tasks, source = evaluation_tasks(cfg, ctx, None)  # type: ignore[arg-type]
    assert len(tasks) == 20 and str(path) in source
    subset, uri = load_or_draw_subset(store, tasks, cfg, seed=7)
    assert not subset.by_difficulty and "no difficulty labels" in subset.note
    assert uri.startswith(store.root_uri + "/eval_subsets/") and uri.endswith("-n5-s7-repo.json")
    # reused, not redrawn: a changed saved file is what comes back
    saved = Subset.from_json(store.read_bytes(store.rel_of(uri)))
    assert load_or_draw_subset(store, tasks, cfg, seed=7) == (saved, uri)
    assert load_or_draw_subset(store, tasks, cfg, seed=8)[1] != uri


def test_the_training_split_is_a_fixed_probe_set_named_as_such(tmp_path: Path) -> None:
    """evaluate.split: train draws from the curate stage's train.parquet (and the report says so)."""
    from swerl.config.evaluate import EvaluateConfig
    from swerl.data.loaders import load_tasks as load_dataset_tasks
    from swerl.data.taskio import tasks_to_parquet
    from swerl.eval.report import markdown_report
    from swerl.stages.evaluate import evaluation_tasks
    from swerl.stages.runner import StageContext, run_stage
    from swerl.storage import Store
    from swerl.tracking import Tracker

    path = tmp_path / "rows.jsonl"
    write_swebench_rows(path, with_difficulty=True)
    rows, _ = load_dataset_tasks(str(path), "swebench", "test", None)
    train, held_out = rows[:12], rows[12:]
    store = Store(f"file://{tmp_path}/store")

    def curate(cfg: object, ctx: StageContext) -> object:
        from swerl.stages.runner import StageResult

        ctx.write_artifact("train.parquet", tasks_to_parquet(train))
        ctx.write_artifact("eval.parquet", tasks_to_parquet(held_out))
        return StageResult()

    tracker = Tracker(f"sqlite:///{tmp_path}/mlflow.db", "split")
    done = run_stage("curate", curate, EvaluateConfig(), store=store, tracker=tracker, parent=None)  # type: ignore[arg-type]
    manifest = done.manifest
    ctx = StageContext(
        stage="evaluate",
        store=store,
        prefix="p",
        workdir=tmp_path,
        inputs={},
        run=None,  # type: ignore[arg-type]
        log=logging.getLogger("test"),
    )
    got, source = evaluation_tasks(EvaluateConfig(split="train"), ctx, manifest)
    assert [t.instance_id for t in got] == [t.instance_id for t in train] and "training split" in source
    got, source = evaluation_tasks(EvaluateConfig(), ctx, manifest)
    assert [t.instance_id for t in got] == [t.instance_id for t in held_out] and "held-out split" in source
    text = markdown_report(
        {},
        [],
        attempts=1,
        temperature=0.0,
        confidence=0.95,
        samples=100,
        subset_note="",
        subset_uri="u",
        by_difficulty=True,
        source=source,
        training_split=True,
    )
    assert text.startswith("# Evaluation on training tasks") and "held-out split" in text
