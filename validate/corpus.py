"""Capture public training scripts unchanged and hold each capture against its model's arithmetic: ``python -m validate corpus``.

``validate/corpus_recipes.json`` names, per configuration, a public repository at a pinned commit,
the script and its arguments, the environment, the synthetic inputs the script reads (made by
``validate/corpus_helper.py``: nothing is downloaded), how to rebuild its model in a separate
process (``arithmetic``) and what its optimizer keeps per parameter (``optimizer``). For each one:

1. the repository's files at the commit (``--repos DIR/OWNER+REPO/``, or ``--extract-from GITS``
   from local clones) are copied to ``WORK/NAME/tree`` and the inputs are made; every file under
   the copy, the inputs and the output folder is hashed;
2. ``allocsim capture --steps N --timeout S -- PYTHON SCRIPT ARGS`` runs the script unchanged (no
   shim, no edit: arguments and environment only) with ``PYTHON`` the corpus interpreter
   (``--python``), from the copy's folder; its wall seconds and the largest resident set of its
   processes (allocsim's and the script's, ``getrusage(RUSAGE_CHILDREN)`` in a wrapper) are kept;
3. the files are hashed again: any file created, changed or removed is listed;
4. the trace is replayed through the pytorch preset (peak allocated and reserved) and the largest
   live bytes of its ``parameter``, ``gradient`` and ``optimizer_state`` categories (as the capture
   named them) are compared with the arithmetic: the model rebuilt from the same configuration by
   ``corpus_helper.py arithmetic`` in another process, every distinct parameter and buffer counted
   as elements x bytes per element. Parameters: all parameters and buffers. Gradients: the trainable
   parameters. Optimizer state: ``states`` x the trainable bytes, plus 4 bytes per trainable tensor
   where the optimizer keeps its ``step`` on the device (fused or capturable Adam/AdamW, as
   ``torch/optim/adam.py`` ``_init_group`` does; a plain ``foreach`` step stays on the CPU).

Captures are kept in ``WORK`` and reused while the recipe is unchanged (``--fresh`` recaptures).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterable, Mapping

from .snapshot_captures import extract_tree, tree_name

HERE = Path(__file__).resolve().parent
RECIPES_PATH = HERE / "corpus_recipes.json"
HELPER = HERE / "corpus_helper.py"
#: Categories compared with the arithmetic, in table order.
COMPARED = ("parameter", "gradient", "optimizer_state")
#: Environment every capture gets: no network, caches under the configuration's own folder.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
               "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false", "PYTHONDONTWRITEBYTECODE": "1",
               "HF_HUB_DISABLE_TELEMETRY": "1", "DISABLE_MLFLOW_INTEGRATION": "TRUE"}
_CACHE_VARS = ("HF_HOME", "TORCH_HOME", "XDG_CACHE_HOME", "MPLCONFIGDIR", "TRITON_CACHE_DIR")
#: Wrapper that runs a command and writes the largest resident set of its processes (KiB) to a file.
_RSS_WRAPPER = ("import resource, subprocess, sys\n"
                "code = subprocess.call(sys.argv[2:])\n"
                "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
                "sys.exit(code)\n")
_STEPS = re.compile(r"(\d+) optimizer steps")


# ---------------------------------------------------------------------------------------------- recipes
def load_recipes(path: str | os.PathLike = RECIPES_PATH) -> dict[str, Any]:
    """The recipe table: ``configurations`` (name -> how to run and check one script)."""
    with open(path, encoding="utf-8") as fh:
        table = json.load(fh)
    for name, cfg in table["configurations"].items():
        for key in ("repo", "commit", "script", "steps", "arithmetic", "optimizer"):
            if key not in cfg:
                raise ValueError(f"{path}: configuration {name!r} has no {key!r}")
        if not re.fullmatch(r"[0-9a-f]{40}", cfg["commit"]):
            raise ValueError(f"{path}: configuration {name!r}: commit must be 40 hex digits")
    return table


def recipe_key(cfg: Mapping[str, Any]) -> str:
    """A short hash of what makes a capture (a changed recipe is captured afresh)."""
    fields = {k: cfg.get(k) for k in ("repo", "commit", "script", "args", "env", "cwd", "pythonpath", "inputs",
                                      "steps", "timeout", "gpu")}
    return hashlib.sha1(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:10]


def expand(value: str, places: Mapping[str, Path]) -> str:
    """``{tree}``, ``{data}``, ``{out}`` in a recipe's argument replaced by the configuration's folders."""
    for key, folder in places.items():
        value = value.replace("{" + key + "}", str(folder))
    return value


# ---------------------------------------------------------------------------------------------- files
def hash_files(folders: Iterable[Path]) -> dict[str, str]:
    """sha256 of every file under ``folders`` (``__pycache__`` left out: Python's, not the script's)."""
    digests: dict[str, str] = {}
    for folder in folders:
        for root, dirs, files in os.walk(folder):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                path = Path(root) / name
                if path.is_symlink() or not path.is_file():
                    digests[str(path)] = "not a regular file"
                    continue
                h = hashlib.sha256()
                with open(path, "rb") as fh:
                    for chunk in iter(lambda: fh.read(1 << 20), b""):
                        h.update(chunk)
                digests[str(path)] = h.hexdigest()
    return digests


def changed_files(before: Mapping[str, str], after: Mapping[str, str], base: Path) -> list[str]:
    """``created PATH`` / ``changed PATH`` / ``removed PATH`` for every difference, paths relative to ``base``."""
    out = []
    for path in sorted(set(before) | set(after)):
        what = ("created" if path not in before else "removed" if path not in after
                else "changed" if before[path] != after[path] else None)
        if what:
            out.append(f"{what} {os.path.relpath(path, base)}")
    return out


# ---------------------------------------------------------------------------------------------- one run
@dataclasses.dataclass
class Outcome:
    """One configuration's capture and what happened around it."""

    name: str
    trace: str | None
    exit_status: int | None
    error: str                       # "" when the capture ran to its end; else the script's error or why nothing ran
    seconds: float = 0.0
    rss_kib: int | None = None
    steps: int | None = None
    changed: list[str] = dataclasses.field(default_factory=list)
    stderr_tail: str = ""
    reused: bool = False


def _inside(folder: Path, path: Path) -> bool:
    """Whether ``path`` resolves inside ``folder`` (a recipe's input never lands elsewhere)."""
    return path.resolve().is_relative_to(folder.resolve())


def _tail(path: Path, limit: int = 64 * 1024) -> str:
    """The last ``limit`` bytes of a file, as text."""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - limit))
        return fh.read().decode("utf-8", "replace")


def _helper(python: str, command: str, payload: Mapping[str, Any], timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([python, str(HELPER), command, json.dumps(payload)], capture_output=True, text=True,
                          timeout=timeout)


def run_capture(name: str, cfg: Mapping[str, Any], repos: Path, work: Path, python: str,
                timeout: float | None = None, fresh: bool = False) -> Outcome:
    """Copy the tree, make the inputs, capture the script unchanged and list what changed; never raises for a failed script."""
    home = work / name
    sidecar = home / f"capture-{recipe_key(cfg)}.json"
    output = home / f"capture-{recipe_key(cfg)}.parquet"
    if sidecar.exists() and not fresh:
        info = json.loads(sidecar.read_text())
        if info.get("trace") is None or output.exists():
            return Outcome(**{k: info.get(k) for k in ("name", "trace", "exit_status", "error", "seconds", "rss_kib",
                                                       "steps", "changed", "stderr_tail")}, reused=True)
    source = repos / tree_name(cfg["repo"])
    if not (source / cfg["script"]).is_file():
        return Outcome(name, None, None, f"not extracted: {tree_name(cfg['repo'])}/{cfg['script']} is missing "
                       f"under --repos (files of {cfg['repo']}@{cfg['commit'][:8]})")
    wrong = check_script(cfg, source)
    if wrong:
        return Outcome(name, None, None, f"not the pinned file: {wrong}")
    if home.exists():
        shutil.rmtree(home)
    places = {"tree": home / "tree", "data": home / "data", "out": home / "out"}
    shutil.copytree(source, places["tree"], symlinks=True)
    for folder in (places["data"], places["out"], home / "cache"):
        folder.mkdir(parents=True, exist_ok=True)
    for spec in cfg.get("inputs", []):
        if not _inside(home, Path(expand(spec["path"], places))):
            return Outcome(name, None, None, f"inputs not made: {spec['path']} is not under the configuration's folder")
        if spec["kind"] == "copy":   # a file of another pinned repository (pytorch/examples' WikiText-2)
            target = Path(expand(spec["path"], places))
            if spec.get("if_missing") and target.exists():
                continue
            source_file = repos / tree_name(spec["repo"]) / spec["file"]
            if not source_file.is_file():
                return Outcome(name, None, None, f"inputs not made: {tree_name(spec['repo'])}/{spec['file']} "
                               "is missing under --repos")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source_file, target)
    made_here = [spec for spec in cfg.get("inputs", []) if spec["kind"] != "copy"]
    if made_here:
        inputs = [dict(spec, path=expand(spec["path"], places)) for spec in made_here]
        made = _helper(python, "inputs", {"root": str(home), "inputs": inputs})
        if made.returncode != 0:
            return Outcome(name, None, None, "inputs not made: " + (made.stderr.strip().splitlines() or ["?"])[-1])
    env = dict(os.environ)
    env.update(OFFLINE_ENV)
    env.update({var: str(home / "cache" / var.lower()) for var in _CACHE_VARS})
    paths = [str(places["tree"] / p) for p in cfg.get("pythonpath", [])]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update({k: expand(v, places) for k, v in cfg.get("env", {}).items()})
    cwd = places["tree"] / cfg.get("cwd", ".")
    before = hash_files(places.values())
    rss_file = home / "rss.txt"
    limit = cfg.get("timeout", timeout or 600)
    argv = [sys.executable, "-c", _RSS_WRAPPER, str(rss_file),
            sys.executable, "-m", "allocsim", "capture", "--gpu", cfg.get("gpu", "A100 80GB"),
            "--steps", str(cfg["steps"]), "--timeout", str(int(limit)), "-o", str(output), "--",
            python, str(places["tree"] / cfg["script"]), *(expand(a, places) for a in cfg.get("args", []))]
    t0 = time.perf_counter()
    # The script's output goes to files (a chatty script cannot fill this process's memory); their tails are read.
    with open(home / "stdout.txt", "wb") as out_fh, open(home / "stderr.txt", "wb") as err_fh:
        try:
            status = subprocess.run(argv, cwd=cwd, env=env, stdout=out_fh, stderr=err_fh,
                                    timeout=limit + 120).returncode
        except subprocess.TimeoutExpired:
            status = None
    seconds = time.perf_counter() - t0
    stdout, stderr = _tail(home / "stdout.txt"), _tail(home / "stderr.txt")
    if status is None:
        stderr += "\n(harness: killed)"
    after = hash_files(places.values())
    error = ""
    stops = [line for line in stderr.splitlines() if "the trace stops where" in line]
    if stops:
        error = stops[-1].split("the trace stops where", 1)[1].strip()
    elif status != 0:
        error = (stderr.strip().splitlines() or [f"exit status {status}"])[-1]
    steps = _STEPS.findall(stdout)
    outcome = Outcome(name, str(output) if output.exists() else None, status, error, round(seconds, 1),
                      int(rss_file.read_text()) if rss_file.exists() else None,
                      int(steps[-1]) if steps else None, changed_files(before, after, home),
                      "\n".join(stderr.strip().splitlines()[-40:]))
    sidecar.write_text(json.dumps(dataclasses.asdict(outcome) | {"argv": argv[4:], "recipe": dict(cfg)},
                                  indent=1) + "\n")
    return outcome


# ---------------------------------------------------------------------------------------------- figures
def category_peaks(trace: Any) -> dict[str, int]:
    """The largest live bytes of each category over the trace, as ``allocsim capture`` named them."""
    import numpy as np
    from allocsim.metrics.categories import CATEGORIES, categorize

    ev = trace.events
    kinds = ev["kind"].to_numpy()
    ids = ev["alloc_id"].to_numpy()
    sizes = ev["size_bytes"].to_numpy().astype(np.int64)
    alloc = kinds == 1
    size_of = dict(zip(ids[alloc].tolist(), sizes[alloc].tolist()))
    freed = kinds == 2
    delta = np.zeros(len(kinds), np.int64)
    delta[alloc] = sizes[alloc]
    delta[freed] = -np.array([size_of.get(i, 0) for i in ids[freed].tolist()], dtype=np.int64)
    codes = categorize(trace).of(ids)
    out = {}
    for code, name in enumerate(CATEGORIES):
        mask = (codes == code) & (alloc | freed)
        out[name] = int(np.cumsum(delta[mask]).max()) if mask.any() else 0
    return out


def measure(trace_path: str) -> dict[str, Any]:
    """Peaks of the capture replayed through the pytorch preset, and its category peaks."""
    import allocsim
    trace = allocsim.read_trace(trace_path)
    summary = allocsim.run(trace, "pytorch", fast=True).summary
    return {"peak_allocated_bytes": int(summary["peak_allocated_bytes"]),
            "peak_reserved_bytes": int(summary["peak_reserved_bytes"]),
            "categories": category_peaks(trace)}


def expected_bytes(counts: Mapping[str, Any], optimizer: Mapping[str, Any]) -> dict[str, int]:
    """What the model arithmetic says each compared category holds (see the module's docstring)."""
    params = counts["params"]
    trainable = [(n, size) for n, size, grad in params if grad]
    trainable_bytes = sum(n * size for n, size in trainable)
    state = int(optimizer.get("states", 0)) * trainable_bytes
    if optimizer.get("device_step"):
        state += 4 * len(trainable)
    return {"parameter": sum(n * s for n, s, _ in params) + sum(n * s for n, s in counts["buffers"]),
            "gradient": trainable_bytes if optimizer.get("gradients", True) else 0,
            "optimizer_state": state}


def arithmetic(name: str, cfg: Mapping[str, Any], work: Path, python: str) -> dict[str, Any]:
    """The model's tensors counted in a separate process (cached beside the capture)."""
    home = work / name
    cache = home / f"arithmetic-{hashlib.sha1(json.dumps(cfg['arithmetic'], sort_keys=True).encode()).hexdigest()[:10]}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    done = _helper(python, "arithmetic", {"tree": str(home / "tree"), "spec": cfg["arithmetic"]})
    if done.returncode != 0:
        result = {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    else:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    cache.write_text(json.dumps(result) + "\n")
    return result


def evaluate(table: Mapping[str, Any], repos: str | os.PathLike, work: str | os.PathLike, python: str,
             only: Iterable[str] | None = None, jobs: int = 2, timeout: float | None = None,
             fresh: bool = False) -> list[dict[str, Any]]:
    """One row per configuration (those whose name contains one of ``only``)."""
    repos, work = Path(repos).resolve(), Path(work).resolve()
    names = [n for n in table["configurations"] if not only or any(o in n for o in only)]
    configs = table["configurations"]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        outcomes = list(pool.map(lambda n: run_capture(n, configs[n], repos, work, python, timeout, fresh), names))
    rows = []
    for name, outcome in zip(names, outcomes):
        cfg = configs[name]
        row: dict[str, Any] = {"name": name, "repo": cfg["repo"], "commit": cfg["commit"], "script": cfg["script"],
                               "command": " ".join([cfg["script"], *cfg.get("args", [])]), "features": cfg.get("features", ""),
                               "steps_asked": cfg["steps"], **dataclasses.asdict(outcome)}
        row["unchanged"] = outcome.exit_status == 0
        row["complete"] = outcome.exit_status == 0 and outcome.trace is not None
        if (work / name / "tree").is_dir():
            counts = arithmetic(name, cfg, work, python)
            row["arithmetic"] = counts if "error" in counts else {"built_on": counts["built_on"]}
            if "error" not in counts:
                row["expected"] = expected_bytes(counts, cfg["optimizer"])
        if outcome.trace:
            row.update(measure(outcome.trace))
            if "expected" in row:
                row["match"] = {c: row["categories"][c] == row["expected"][c] for c in COMPARED}
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------- output
def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:,.1f}"


def _category_cell(row: Mapping[str, Any]) -> str:
    if "categories" not in row or "expected" not in row:
        why = row.get("arithmetic", {}).get("error") if isinstance(row.get("arithmetic"), dict) else None
        return f"- ({why})" if why else "-"
    parts = []
    for cat, short in zip(COMPARED, ("P", "G", "O")):
        got, want = row["categories"][cat], row["expected"][cat]
        parts.append(f"{short} {_mib(got)}" + (" =" if got == want else f" vs {_mib(want)}"))
    return "; ".join(parts)


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one row per configuration; bytes in MiB; categories capture vs arithmetic (``=`` exact)."""
    lines = ["| configuration | script @ commit | features | runs unchanged | complete trace | steps | capture s | "
             "RSS MiB | peak allocated MiB | peak reserved MiB | categories: capture (vs arithmetic) | files changed |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unchanged = "yes" if r["unchanged"] else f"**no**: {_short_error(r['error'])}"
        changed = "none" if not r["changed"] else f"{len(r['changed'])}: " + ", ".join(r["changed"][:3]) + (
            ", ..." if len(r["changed"]) > 3 else "")
        lines.append(" | ".join([
            f"| {r['name']}", f"{r['repo']}/{r['script']} @ {r['commit'][:8]}", r["features"], unchanged,
            "yes" if r["complete"] else "no", str(r.get("steps") if r.get("steps") is not None else "-"),
            f"{r['seconds']:.0f}", _mib(r["rss_kib"] * 1024 if r.get("rss_kib") else None),
            _mib(r.get("peak_allocated_bytes")), _mib(r.get("peak_reserved_bytes")), _category_cell(r),
            changed]) + " |")
    return "\n".join(lines)


def _short_error(text: str, limit: int = 160) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[:limit] + "..."


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts: configurations, run unchanged, complete, categories exact, with files changed."""
    return {"configurations": len(rows), "unchanged": sum(r["unchanged"] for r in rows),
            "complete": sum(r["complete"] for r in rows),
            "categories_exact": sum(bool(r.get("match")) and all(r["match"].values()) for r in rows),
            "files_changed": sum(bool(r["changed"]) for r in rows)}


#: Files a script may read from its repository: code, configurations, the data some repositories ship.
TREE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".txt", ".cfg", ".toml")


def extract(table: Mapping[str, Any], gits: str | os.PathLike, repos: str | os.PathLike) -> list[str]:
    """Write every configuration's repository files at its commit from local clones ``GITS/OWNER+REPO``
    (bare or not, or with the clone in a ``repo`` subfolder); lines saying what was done."""
    lines, done = [], set()
    for cfg in table["configurations"].values():
        key = (cfg["repo"], cfg["commit"])
        if key in done:
            continue
        done.add(key)
        base = Path(gits) / tree_name(cfg["repo"])
        git_dir = base / "repo" if (base / "repo").is_dir() else base
        if not git_dir.is_dir():
            lines.append(f"{cfg['repo']}: no clone at {base}")
            continue
        n = extract_tree(git_dir, cfg["commit"], Path(repos) / tree_name(cfg["repo"]), TREE_SUFFIXES)
        lines.append(f"{cfg['repo']}@{cfg['commit'][:8]}: {n} files")
    return lines


def check_script(cfg: Mapping[str, Any], tree: Path) -> str | None:
    """Why the script under ``tree`` is not the recipe's (its ``script_sha256``), or None when it is."""
    want = cfg.get("script_sha256")
    path = tree / cfg["script"]
    if not want or not path.is_file():
        return None
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    return None if got == want else f"{cfg['script']} is not the recipe's (sha256 {got[:12]}, want {want[:12]})"
