"""Dataset files by path, compressed as they are published; names that are neither a file nor a
reachable hub dataset fail in one line, at once; a file whose rows are bad names the first of them
and how many there are."""

import bz2
import gzip
import json
import lzma
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo.assembly import load_data
from grpo.config import build_config
from grpo.data import DataError, load_rows

HUMANEVAL = Path(__file__).parent / "data" / "code" / "humaneval.jsonl"


def _humaneval_rows() -> list[dict]:
    return [json.loads(line) for line in HUMANEVAL.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("suffix, opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)])
def test_a_compressed_jsonl_file_is_read_as_a_local_file(tmp_path, suffix, opener):
    # HumanEval.jsonl.gz is how openai/human-eval publishes the benchmark
    rows = _humaneval_rows()
    path = tmp_path / f"HumanEval.jsonl{suffix}"
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    started = time.monotonic()
    out = load_rows(str(path))
    assert time.monotonic() - started < 10           # no hub look-up, no retries
    assert [r["prompt"] for r in out] == [r["prompt"] for r in rows]
    assert [r["entry_point"] for r in out] == [r["entry_point"] for r in rows]
    assert [r["task_id"] for r in out] == [r["task_id"] for r in rows]


def test_a_bad_line_in_a_compressed_file_is_named(tmp_path):
    path = tmp_path / "HumanEval.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.write(json.dumps({"prompt": "a"}) + "\n{not json\n")
    with pytest.raises(DataError, match=r"HumanEval.jsonl.gz line 2: not valid JSON"):
        load_rows(str(path))


def test_a_zst_file_without_zstandard_says_what_to_install(tmp_path, monkeypatch):
    path = tmp_path / "HumanEval.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + b"\0" * 8)     # the zstd magic number; never read here
    monkeypatch.setitem(sys.modules, "zstandard", None)   # as if it were not installed
    with pytest.raises(DataError, match=r"HumanEval.jsonl.zst: .*zstandard.*pip install zstandard"):
        load_rows(str(path))


def test_a_missing_compressed_file_is_not_taken_for_a_hub_name(tmp_path):
    with pytest.raises(DataError, match=r"dataset file not found: .*HumanEval.jsonl.gz"):
        load_rows(str(tmp_path / "HumanEval.jsonl.gz"))


def test_an_unreachable_hub_name_fails_in_one_line_at_once(monkeypatch):
    # Nothing listens on port 1 of loopback: the hub is unreachable, and the answer must come at
    # once rather than after the hub client's retries (23 s with no network).
    import datasets
    import huggingface_hub.constants
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:1")
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    started = time.monotonic()
    with pytest.raises(DataError) as caught:
        load_rows("someone/no-such-dataset")
    assert time.monotonic() - started < 10
    message = str(caught.value)
    assert "\n" not in message
    assert "someone/no-such-dataset" in message and "neither a file nor a directory" in message
    assert "127.0.0.1:1" in message


def test_an_unknown_name_offline_fails_in_one_line_at_once(tmp_path):
    # conftest sets HF_HUB_OFFLINE=1; the command line turns the error into exit 2
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "grpo.commands.cli", "train", "dataset=someone/no-such-dataset",
                           f"output_dir={tmp_path / 'run'}"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert time.monotonic() - started < 60
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "someone/no-such-dataset" in lines[0], done.stderr
    assert "Traceback" not in done.stderr


# ---- Bad rows: the first one, and how many ---------------------------------------------------------

def _gsm8k(tmp_path, bad: set[int], n: int = 20) -> str:
    path = tmp_path / "gsm8k.jsonl"
    path.write_text("".join(json.dumps({"question": f"{i} + 1 =",
                                        "answer": "" if i in bad else f"#### {i + 1}"}) + "\n"
                            for i in range(n)))
    return str(path)


def test_every_bad_gold_names_the_first_row_and_the_count(tmp_path):
    path = _gsm8k(tmp_path, bad=set(range(20)))
    with pytest.raises(DataError, match=r"gsm8k.jsonl row 1: answer '' holds no value.*; 20 of the 20 rows"):
        load_data(build_config({"dataset": path, "seed": 0}))


def test_some_bad_golds_name_the_first_in_file_order(tmp_path):
    path = _gsm8k(tmp_path, bad={6, 2, 15})        # rows 3, 7 and 16 of the file
    for seed in (0, 1, 2):                          # whatever order the rows are shuffled in
        with pytest.raises(DataError, match=r"gsm8k.jsonl row 3: .*; 3 of the 20 rows"):
            load_data(build_config({"dataset": path, "seed": seed}))


def test_one_bad_gold_names_its_row_alone(tmp_path):
    path = _gsm8k(tmp_path, bad={11})
    with pytest.raises(DataError) as caught:
        load_data(build_config({"dataset": path, "seed": 0}))
    assert "gsm8k.jsonl row 12:" in str(caught.value) and "of the 20 rows" not in str(caught.value)


def test_bad_code_tests_name_the_first_row_and_the_count(tmp_path):
    rows = _humaneval_rows()[:1] * 6
    rows = [dict(r, test="" if i in (1, 4) else r["test"]) for i, r in enumerate(rows)]
    path = tmp_path / "he.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"he.jsonl row 2.*; 2 of the 6 rows"):
        load_data(build_config({"dataset": str(path), "rewards": ["code_tests"], "seed": 3}))
