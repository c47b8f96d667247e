"""Grids and matched rounds under torchrun: two gloo processes on the CPU share out the clips the store lacks, the
first gathers them, and the tables are those of one process."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st
from test_resume import start_experiment, stored_clips

from specasr import ranks as specasr_ranks
from specasr.ranks import Ranks, joined, leave
from specasr.store import Store
from specasr.trace import CodeVersion, SettingsError

ROOT = Path(__file__).resolve().parents[1]
# One thread, torchrun's own default: the same float sums in every run
ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
GRID = [
    "experiment",
    "--clips",
    "3",
    "--repeats",
    "1",
    "--draft",
    "random",
    "--k",
    "2",
    "--window",
    "unrestricted,correct",
]
MATCHED = ["matched", "--clips", "3", "--draft", "random", "--k", "2", "--window", "unrestricted,correct", "--json"]


@given(st.lists(st.floats(0.1, 100), max_size=30), st.integers(1, 5))
def test_shares_are_disjoint_cover_every_item_and_differ_by_at_most_one_item(sizes, processes):
    shares = [Ranks(rank, processes).shares(sizes) for rank in range(processes)]
    assert all(found == shares[0] for found in shares)  # every rank deals the same shares
    dealt = [i for share in shares[0] for i in share]
    assert sorted(dealt) == list(range(len(sizes)))
    loads = [sum(sizes[i] for i in share) for share in shares[0]]
    assert max(loads) - min(loads) <= max(sizes, default=0)  # each item went to the least loaded rank


def run(*command: str, processes: int = 0) -> str:
    """`python COMMAND`, under torchrun with `processes` gloo processes where above 0; its stdout."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    command = [*(launcher if processes else [sys.executable]), *command]
    done = subprocess.run(command, cwd=ROOT, env=ONE_THREAD, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def specasr(*args: str, processes: int = 0) -> str:
    return run("-m", "specasr", *args, processes=processes)


def without_speed(record: dict) -> dict:
    """An experiment's JSON tables but for what the clock measured (and the run ids, which differ by store)."""
    timed = ("decode_speedup", "total_speedup", "fastest", "run_id")
    kept = {}
    for name, value in record.items():
        if name in ("aa", "aa_warning", "timing") or name.endswith("_run"):
            continue
        if isinstance(value, list):
            value = [{k: v for k, v in row.items() if not k.startswith(timed)} for row in value]
            value = [row for row in value if "speedup" not in str(row.get("metric", ""))]
        kept[name] = value
    return kept


def test_a_grid_resumed_by_two_processes_stores_one_batch_and_prints_the_tables_of_one_process(speech, tmp_path):
    alone = json.loads(specasr(*GRID, "--db", str(tmp_path / "alone.duckdb"), "--json"))

    db = tmp_path / "runs.duckdb"
    process = start_experiment(db, GRID, ONE_THREAD)
    assert stored_clips(db, process) == 1
    process.kill()
    process.communicate(timeout=60)
    kept = Store(db).runs()

    shared = json.loads(specasr(*GRID, "--db", str(db), "--json", processes=2))  # one JSON object: one rank prints
    history = Store(db).runs()
    assert sorted(history.run_id) == sorted(kept.run_id) and (history.decodes == 3).all()  # the batch completed
    assert shared["baseline_run"] in set(kept.run_id)
    assert without_speed(shared) == without_speed(alone)
    assert len(alone["contrasts"]) and len(alone["peaks"])  # the windows compared, the attention peaks read
    assert shared["cells"][0]["decode_speedup"] > 0


def test_matched_rounds_rolled_out_by_two_processes_give_the_tables_of_one_process(speech, tmp_path):
    alone = specasr(*MATCHED, "--db", str(tmp_path / "alone.duckdb"))
    shared = specasr(*MATCHED, "--db", str(tmp_path / "shared.duckdb"), processes=2)
    assert json.loads(shared) == json.loads(alone)
    assert json.loads(alone)["summary"][0]["clips"] == 3


def test_processes_that_run_different_code_or_share_a_gpu_are_refused_by_every_one(tmp_path):
    run(__file__, str(tmp_path), processes=2)
    said = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    shared = "2 processes share GPUs: give each its own (--nproc-per-node <= GPUs)"
    different = "the processes run different code (commit or uncommitted changes): one batch, one code"
    assert said == [{"alike": None, "one GPU": shared, "one differs": different}] * 2


def refusal(ranks: Ranks, device: str) -> str | None:
    try:
        ranks.check_timed_alike(device)
    except SettingsError as error:
        return str(error)
    return None


def check_processes(log: Path) -> None:
    """This process's checks, as JSON in `log`: as it runs, as if on the GPU the other has, with other code."""
    ranks = joined()
    said = {"alike": refusal(ranks, "cpu")}
    torch.cuda.current_device = lambda: 0
    said["one GPU"] = refusal(ranks, "cuda")
    if ranks.rank == 1:
        specasr_ranks.code_version = lambda: CodeVersion("0.0.0", "another commit", False)
    said["one differs"] = refusal(ranks, "cpu")
    (log / f"rank-{ranks.rank}.json").write_text(json.dumps(said))
    leave()


if __name__ == "__main__":
    check_processes(Path(sys.argv[1]))
