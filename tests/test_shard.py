"""Shards (by id, balanced by recorded durations), merge of shard outputs, GPU names and
worker binding: pure logic, on the real H200 matrix of reports/2026-11-30-h200-s3."""

import gzip
import json
from pathlib import Path

import pytest

from cutedebug.commands import shard, triage
from cutedebug.engine import gpus

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "reports" / "2026-11-30-h200-s3" / "matrix.json.gz"


def real_matrix() -> dict:
    return json.loads(gzip.open(MATRIX, "rt").read())


# ---- --shard I/N -----------------------------------------------------------------------------
@pytest.mark.parametrize("text, want", [("1/1", (1, 1)), ("2/4", (2, 4)), ("8/8", (8, 8))])
def test_shard_spec(text, want):
    assert shard.parse_shard(text) == want


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "a/4", "1-4", "", "1/2/3"])
def test_bad_shard_spec_names_the_form(text):
    with pytest.raises(shard.ShardError, match=r"expected I/N with 1 <= I <= N"):
        shard.parse_shard(text)


def test_by_id_the_shards_partition_the_scenarios_and_a_new_one_moves_nothing():
    ids = [r["id"] for r in real_matrix()["scenarios"]]
    parts = [shard.select(ids, (i, 4)) for i in range(1, 5)]
    assert set().union(*parts) == set(ids) and sum(map(len, parts)) == len(ids)
    grown = shard.assign(ids + ["new_family/new_case"], 4)
    assert all(grown[k] == shard.assign(ids, 4)[k] for k in ids)
    # the order the ids come in does not matter either
    assert shard.assign(list(reversed(ids)), 4) == shard.assign(ids, 4)


def test_balanced_by_durations_longest_first_to_the_least_loaded_shard():
    d = {"a": 10.0, "b": 7.0, "c": 5.0, "d": 4.0, "e": 3.0}
    # a->1 (10,0), b->2 (10,7), c->2 (10,12), d->1 (14,12), e->2 (14,15)
    assert shard.assign(list("edcba"), 2, d) == {"a": 1, "b": 2, "c": 2, "d": 1, "e": 2}
    # an id the durations do not know counts as their median (5.0): f after c, before d
    assert shard.assign(list("abcdef"), 2, d)["f"] == 1


def test_durations_from_a_real_matrix_balance_its_shards():
    durations = shard.durations_from(MATRIX)
    recs = real_matrix()["scenarios"]
    assert len(durations) == len(recs)
    one = next(r for r in recs if r["run"])
    assert durations[one["id"]] == pytest.approx(one["compile"]["wall_s"] + one["run"]["wall_s"])
    ids = list(durations)
    loads = [sum(durations[k] for k in shard.select(ids, (i, 4), durations)) for i in (1, 2, 3, 4)]
    # greedy longest-first: the spread is at most the longest single scenario
    assert max(loads) - min(loads) <= max(durations.values())
    by_id = [sum(durations[k] for k in shard.select(ids, (i, 4))) for i in (1, 2, 3, 4)]
    assert max(loads) - min(loads) < max(by_id) - min(by_id)


def test_unreadable_durations_name_the_file(tmp_path):
    bad = tmp_path / "matrix.json"
    bad.write_text("{not json")
    with pytest.raises(shard.ShardError, match=str(bad)):
        shard.durations_from(tmp_path)


# ---- merge -----------------------------------------------------------------------------------
def write_shard(d: Path, recs: list[dict], m: dict, total_s: float, health=True) -> None:
    for r in recs:
        triage.atomic_write(d / "results" / triage.record_name(r["id"]), json.dumps(r))
    facts = dict(m["facts"], total_s=total_s, gpu_health={"healthy": health})
    triage.write_matrix(
        d,
        triage.build_matrix(
            [triage.TriageRecord.from_json(r) for r in recs],
            dir_="scenarios",
            command="triage",
            env=triage.Environment.from_json(m["environment"]),
            facts=triage.Facts.from_json(facts),
        ),
    )


def test_merged_shards_give_the_matrix_of_one_run(tmp_path):
    m = real_matrix()
    recs = m["scenarios"]
    ids = [r["id"] for r in recs]
    for i in (1, 2, 3):
        mine = shard.select(ids, (i, 3))
        write_shard(tmp_path / f"s{i}", [r for r in recs if r["id"] in mine], m, 50.0 + i)
    out = tmp_path / "all"
    merged = shard.merge([tmp_path / f"s{i}" for i in (1, 2, 3)], out)
    assert [r.id for r in merged.scenarios] == sorted(ids)
    # the same rates as one triage of all
    assert merged.rates == triage.rates([triage.TriageRecord.from_json(r) for r in recs])
    # and the four rates the recorded H200 triage itself wrote (its counts predate
    # "exposed_by_perturbation")
    keys = ("detection", "classification", "localization", "false_alarms")
    assert {k: merged.rates.rate(k).to_json() for k in keys} == {k: m["rates"][k] for k in keys}
    assert merged.facts.total_s == 53.0  # the slowest shard
    assert merged.facts.gpu_health["healthy"] is True
    assert len(list((out / "results").glob("*.json"))) == len(ids)
    md = (out / "matrix.md").read_text()
    assert "# cutedebug triage" in md and "processes of ours left: 0" in md
    # reports are linked from the merged folder to where each shard wrote them
    one = next(r for r in merged.scenarios if r.run)
    orig = next(r for r in recs if r["id"] == one.id)
    owner = next(i for i in (1, 2, 3) if one.id in shard.select(ids, (i, 3)))
    assert (out / one.run.report).resolve() == (
        tmp_path / f"s{owner}" / orig["run"]["report"]
    ).resolve()


def test_merge_refuses_overlapping_shards_and_reports_an_unhealthy_one(tmp_path):
    m = real_matrix()
    recs = m["scenarios"][:10]
    write_shard(tmp_path / "a", recs[:6], m, 10.0)
    write_shard(tmp_path / "b", recs[5:], m, 10.0, health=False)
    with pytest.raises(shard.ShardError, match=f"{recs[5]['id']} is in .*a and in .*b"):
        shard.merge([tmp_path / "a", tmp_path / "b"], tmp_path / "out")
    write_shard(tmp_path / "c", recs[6:], m, 10.0, health=False)
    merged = shard.merge([tmp_path / "a", tmp_path / "c"], tmp_path / "out")
    assert merged.facts.gpu_health["healthy"] is False
    with pytest.raises(shard.ShardError, match="not a readable triage matrix"):
        shard.merge([tmp_path / "a", tmp_path / "missing"], tmp_path / "out")


# ---- GPUs ------------------------------------------------------------------------------------
def test_visible_gpus_follow_cuda_visible_devices():
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "3,1"}) == ["3", "1"]
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == ["GPU-aa", "GPU-bb"]
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,-1,2"}) == ["0"]  # CUDA stops at -1
    assert gpus.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == []


def test_gpu_spec_all_or_a_checked_list():
    assert gpus.parse_gpus("all", ["0", "1", "2"]) == ["0", "1", "2"]
    assert gpus.parse_gpus("2,0", ["0", "1", "2"]) == ["2", "0"]
    with pytest.raises(
        gpus.GpuSpecError,
        match=r"5 not visible here; allowed: 'all' or a comma "
        r"list of 0, 1",
    ):
        gpus.parse_gpus("0,5", ["0", "1"])
    with pytest.raises(gpus.GpuSpecError, match="named twice"):
        gpus.parse_gpus("1,1", ["0", "1"])
    with pytest.raises(gpus.GpuSpecError, match="no GPU is visible"):
        gpus.parse_gpus("0", [])


def test_xdist_worker_gets_its_gpu_round_robin():
    assert [gpus.worker_index(w) for w in ("gw0", "gw7", "master", None, "gwx")] == [
        0,
        7,
        None,
        None,
        None,
    ]
    assert [gpus.gpu_for_worker(i, ["4", "5"]) for i in range(5)] == ["4", "5", "4", "5", "4"]
