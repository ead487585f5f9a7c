#!/usr/bin/env python3
"""PyTorch flight recorder dumps without PyTorch: the fixtures of serve's reader and the
fake ranks of scripts/ras-hang-gpu.sh --dry.

The dump is what torch/csrc/distributed/c10d/FlightRecorderDetail.hpp dump_dict() builds
(format "version" 2.10: version, comm_lib_version, pg_config, pg_status, entries with
record_id, pg_id, process_group (name, desc), collective_seq_id, p2p_seq_id, op_id,
profiling_name, time_created_ns, input_sizes, input_dtypes, output_sizes, output_dtypes,
state, time_discovered_*, retired, timeout_ms, is_p2p, frames of name/filename/line,
innermost first), pickled at protocol 2 as plain dicts and lists, as pickle_str does
(the TorchScript pickler with tag_aggregates off) and as Python's pickle reads it.

  fr_dump.py write OUT RANK SCENARIO     one dump (SCENARIO: divergent, sleep, healthy)
  fr_dump.py rank DIR RANK SCENARIO [BAD] a fake rank until killed (BAD: the faulty rank,
                                         default 1): makes DIR/pipe_RANK.pipe,
                                         opens it O_RDONLY|O_NONBLOCK as DumpPipe does,
                                         reads it every second, and on any byte writes
                                         DIR/dump_RANK
  fr_dump.py fixtures DIR                the committed fixtures and their expected JSON
"""

import json
import os
import pickle
import sys
import time

TORCH = "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed"


def frame(name, filename, line):
    return {"name": name, "filename": filename, "line": line}


def entry(record, seq, name, state, frames, size=1048576):
    return {
        "frames": frames,
        "record_id": record,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": name,
        "time_created_ns": 1_760_000_000_000_000_000 + record,
        "input_sizes": [[size]],
        "input_dtypes": ["Float"],
        "output_sizes": [[size]],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": None,
        "time_discovered_completed_ns": None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
    }


def dump(rank, scenario, last=352, bad=1):
    """The dump of `rank` in `scenario`: the rank `bad` waits in _all_gather_base #last
    at line 10, the others in all_reduce #last at line 12 (divergent); in `sleep` the rank
    `bad` completed everything and sleeps while the others' all_reduce has started;
    `healthy`: everyone completed."""
    allreduce = [
        frame("all_reduce", f"{TORCH}/distributed_c10d.py", 2951),
        frame("wrapper", f"{TORCH}/c10d_logger.py", 81),
        frame("step", "/job/train3.py", 12),
        frame("<module>", "/job/train3.py", 25),
    ]
    gather = [
        frame("_all_gather_base", f"{TORCH}/distributed_c10d.py", 4135),
        frame("wrapper", f"{TORCH}/c10d_logger.py", 81),
        frame("step", "/job/train3.py", 10),
        frame("<module>", "/job/train3.py", 25),
    ]
    entries = [entry(i, i + 1, "nccl:all_reduce", "completed", allreduce) for i in range(last - 1)]
    if scenario == "divergent":
        if rank != bad:
            entries.append(entry(last - 1, last, "nccl:all_reduce", "scheduled", allreduce))
        else:
            entries.append(entry(last - 1, last, "nccl:_all_gather_base", "scheduled", gather))
    elif scenario == "sleep" and rank != bad:
        entries.append(entry(last - 1, last, "nccl:all_reduce", "started", allreduce))
    entries = entries[-2000:]
    return {
        "version": "2.10",
        "comm_lib_version": "2.28.9",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "pg_status": {
            "0": {
                "last_enqueued_collective": entries[-1]["collective_seq_id"],
                "last_started_collective": last - 1,
                "last_completed_collective": last - 1,
            }
        },
        "entries": entries,
    }


def write(path, rank, scenario, bad=1):
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(pickle.dumps(dump(int(rank), scenario, bad=int(bad)), protocol=2))
    os.replace(tmp, path)


def fake_rank(directory, rank, scenario, bad=1):
    pipe = os.path.join(directory, f"pipe_{rank}.pipe")
    try:
        os.unlink(pipe)
    except FileNotFoundError:
        pass
    os.mkfifo(pipe, 0o666)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    while True:
        time.sleep(1)
        try:
            data = os.read(fd, 128)
        except BlockingIOError:
            data = b""
        if data:
            write(os.path.join(directory, f"dump_{rank}"), rank, scenario, bad)


def fixtures(directory):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "dump-2.10.pickle"), "wb") as f:
        f.write(pickle.dumps(dump(1, "divergent"), protocol=2))
    with open(os.path.join(directory, "dump-2.10-rank0.pickle"), "wb") as f:
        f.write(pickle.dumps(dump(0, "divergent"), protocol=2))
    # The same plain data at every protocol Python writes it, with what it holds as
    # JSON: the unpickler must read each to the same values.
    sample = {
        "ints": [0, 1, -1, 255, 256, 65535, 65536, -2**31, 2**31 - 1, 2**40, -2**63, 2**63 - 1],
        "floats": [0.0, -1.5, 1e300],
        "text": ["", "a", "é", "x" * 300],
        "nested": {"t": (1, "two", None), "l": [[1, 2], {"k": True}], "f": False},
        "shared": None,
    }
    sample["shared"] = sample["nested"]["l"]
    for proto in (2, 3, 4, 5):
        with open(os.path.join(directory, f"plain-p{proto}.pickle"), "wb") as f:
            f.write(pickle.dumps(sample, protocol=proto))
    with open(os.path.join(directory, "plain.json"), "w") as f:
        json.dump(sample, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "write":
        write(args[0], args[1], args[2])
    elif cmd == "rank":
        fake_rank(args[0], args[1], args[2], args[3] if len(args) > 3 else 1)
    elif cmd == "fixtures":
        fixtures(args[0])
    else:
        sys.exit(f"unknown command {cmd}")
