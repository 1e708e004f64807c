"""Configuration: JSON-schema validation, defaults, and the grid of cells it expands to.

Validation happens when the Snakefile loads, before any job starts: a bad config stops Snakemake
with a message naming the key and the reason.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import yaml

from . import cp_env, problem_settings, shapes, timing_spec
from .attention import masks, varlen
from .cells import CPCell, KernelCell, Shape, cell_name, cp_seqlen, layout_mask, shaped_mask, split_layout  # noqa: F401 — the grid's cells, named in cells.py

SCHEMA_PATH = Path(__file__).resolve().parent / "config.schema.yaml"  # package data (pyproject.toml)


class ConfigError(ValueError):
    """A bad configuration; the message names the offending key."""


# From this length a float64 reference of the whole problem is what the gate would cost.
LONG_GATE = 8192


# Bytes of one element of each dtype a config may name (torch-free: config is read before any job).
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}


def input_bytes(config: dict, seqlen: int, dtype: str, backward: bool) -> int:
    """What one cell's q, k, v and output hold at ``seqlen`` (their gradients too for a backward): a
    lower bound of its memory, before any kernel's workspace or the gate's reference."""
    # q and the output over heads_q, k and v over heads_kv: head_dim for q and k, head_dim_v for v
    # and the output where it is set.
    head_dim_v = config.get("head_dim_v") or config["head_dim"]
    elements = config["batch"] * seqlen * (config["head_dim"] + head_dim_v) * (config["heads_q"] + config["heads_kv"])
    return elements * DTYPE_BYTES.get(dtype, 4) * (2 if backward else 1)


def implausible(config: dict, cores: int, memory_bytes: int | None = None) -> list[str]:
    """What this machine can run but hardly as configured: said before the run starts, not an error.

    * CP cells on the CPU start ``cp_size`` gloo ranks here: more ranks than cores share them;
    * a ``gate_seqlen`` above every length, when the lengths are long (``LONG_GATE`` and up), checks
      each cell at its own length: a float64 reference of the whole problem, not a short copy;
    * CPU cells whose inputs alone pass this machine's memory (``memory_bytes``) cannot fit: each
      becomes an ``oom`` or ``error`` row after it tried;
    * a CP strategy that refuses a cp_size with the config's heads and options (``Strategy.refuses``:
      a degree that does not divide the ranks or the heads) makes unsupported rows there."""
    out = []
    if config["device"] == "cpu" and config["cp_strategies"]:
        crowded = sorted(n for n in config["cp_sizes"] if n > max(cores, 1))
        if crowded:
            out.append(f"config.cp_sizes {crowded}: each CP cell starts that many ranks on this machine's {cores} "
                       f"cores; expect them to be slow and their timings to say little")
    if config["gate_seqlen"] > max(config["seqlens"]) >= LONG_GATE:
        out.append(f"config.gate_seqlen {config['gate_seqlen']} is above every seqlen (largest "
                   f"{max(config['seqlens'])}): each cell is checked at its own length, against a float64 "
                   f"reference of the whole problem")
    if config["cp_strategies"]:
        from . import cp

        for name in config["cp_strategies"]:
            options = config.get("cp_options", {}).get(name, {})
            refused = {size: why for size in config["cp_sizes"]
                       if (why := cp.get(name).sized(size, options).refuses(config["heads_q"], config["heads_kv"]))}
            for size, why in refused.items():
                out.append(f"config.cp_strategies {name!r} at cp_size {size}: {why}; its cells there will be "
                           "unsupported rows")
    if config["device"] == "cpu" and memory_bytes:
        backward = "bwd" in config["directions"]
        too_long = sorted(n for n in config["seqlens"]
                          if max(input_bytes(config, n, d, backward) for d in config["dtypes"]) > memory_bytes)
        if too_long:
            need = max(input_bytes(config, too_long[0], d, backward) for d in config["dtypes"])
            out.append(f"config.seqlens {too_long}: at {too_long[0]} a cell's inputs and outputs alone need "
                       f"{need / 2**30:.1f} GiB, more than this machine's {memory_bytes / 2**30:.1f} GiB; "
                       f"those cells will fail after trying")
    return out


def machine_memory_bytes() -> int | None:
    """This machine's physical memory, where the OS says it."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def or_stop(make, *args):
    """``make(*args)``, or, on a ConfigError, its message alone on stderr and exit status 1: what the
    Snakefile calls, so a bad key reads as one message naming it, not as a traceback headed by the
    line of the workflow that called the check (which reads like a bug in the workflow)."""
    try:
        return make(*args)
    except ConfigError as exc:
        sys.stderr.write(f"{exc}\n")
        sys.exit(1)


def _key_path(path) -> str:
    out = "config"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _apply_defaults(config: dict, schema: dict) -> None:
    for key, sub in schema.get("properties", {}).items():
        if key not in config and "default" in sub:
            config[key] = copy.deepcopy(sub["default"])
        if isinstance(config.get(key), dict) and sub.get("type") == "object":
            _apply_defaults(config[key], sub)


def load_schema(path: Path = SCHEMA_PATH) -> dict:
    with open(path) as f:
        schema = yaml.safe_load(f)
    return _inline_refs(schema, schema)


def _inline_refs(node: Any, root: dict) -> Any:
    """``node`` with each local ``$ref`` (``#/a/b``) replaced by what it points at: the schema says a
    shared definition once, and ``restore_types`` validates sub-schemas standing alone."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = root
            for key in node["$ref"].removeprefix("#/").split("/"):
                target = target[key]
            return _inline_refs(target, root)
        return {key: _inline_refs(value, root) for key, value in node.items()}
    return [_inline_refs(item, root) for item in node] if isinstance(node, list) else node


def load_yaml(path: str | Path) -> Any:
    """A config file's content; a YAML syntax error is a ConfigError naming the file, line and column
    (PyYAML's own message names a stream, Snakemake's names nothing)."""
    try:
        return yaml.safe_load(Path(path).read_text())
    except yaml.MarkedYAMLError as exc:
        def at(mark) -> str:
            return f"line {mark.line + 1}, column {mark.column + 1}"

        mark = exc.problem_mark or exc.context_mark
        message = f"{path}, {at(mark)}: not valid YAML: {exc.problem or exc.context}"
        if exc.context and exc.problem and exc.context_mark:
            message += f" ({exc.context} that starts at {at(exc.context_mark)})"
        raise ConfigError(message) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None


@dataclass(frozen=True)
class MaskEntry:
    name: str      # the label cells and figures use
    pattern: str   # the builder in longca.attention.masks.PATTERNS
    params: dict


def mask_entries(config: dict) -> list[MaskEntry]:
    """The config's masks, then the model presets' masks it does not name itself (a preset's mask
    of a name the config's ``masks`` has is the config's)."""
    own = _entries(config["masks"])
    named = {e.name for e in own}
    extra = [e for model in shapes.models(config) for e in _entries(model.masks) if e.name not in named]
    return own + list({e.name: e for e in extra}.values())


def _entries(items) -> list[MaskEntry]:
    entries = []
    for item in items:
        if isinstance(item, str):
            entries.append(MaskEntry(item, item, {}))
        elif "slices" in item:  # a custom mask: a slice list scaled along the seqlen axis
            params = {"slices": item["slices"]}
            if "base_seqlen" in item:
                params["base_seqlen"] = item["base_seqlen"]
            entries.append(MaskEntry(item["name"], masks.CUSTOM, params))
        else:
            entries.append(MaskEntry(item["name"], item.get("pattern", item["name"]), dict(item.get("params", {}))))
    return entries


# Defaults by device when the config sets none.  A GPU kernel cell is timed by budget (longca.execution.measure.timing):
# a warm-up of at least 25 ms that goes on until the device is steady (at most 1 s), then repetitions
# filling 100 ms (do_bench's warm-up and rep times), in a resident process that keeps the CUDA
# context, libraries and compiled kernels across cells (longca.execution.processes.resident).  A CPU has no boost-clock
# transient and its cells are cheap to fork: counts only, one forked child per cell.  On CUDA the
# timed call is a CUDA graph's replay (longca.execution.measure.graphed): at 1K the launch from Python is as
# long as the GPU's work, and eager event timing measured the CPU's lead instead.
DEVICE_DEFAULTS = {
    "cpu": {"timing": {"warmup_ms": 0.0, "warmup_max_ms": 0.0, "rep_ms": 0.0, "cuda_graph": False},
            "isolation": "worker"},
    "cuda": {"timing": {"warmup_ms": 25.0, "warmup_max_ms": 1000.0, "rep_ms": 100.0, "cuda_graph": True},
             "isolation": "resident"},
}


def merge_files(paths: list[str | Path]) -> dict:
    """Each file over the ones before it, nested mappings merged, as Snakemake merges ``--configfile``
    over the Snakefile's ``configfile:`` (for code that rebuilds a run's config outside Snakemake,
    which lists the workflow's default config first: the package knows no workflow folder)."""
    merged: dict = {}
    for path in map(Path, paths):
        _merge_into(merged, load_yaml(path) or {})
    return merged


def _merge_into(base: dict, over: dict) -> None:
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge_into(base[key], value)
        else:
            base[key] = copy.deepcopy(value)


# Snakemake reads a `--config` value with YAML's base loader, which keeps every scalar inside a list
# or a mapping a string: `seqlens='[4096,8192]'` arrives as ['4096', '8192'] and
# `'timing={warmup: 2, reps: 3}'` as {'warmup': '2', 'reps': '3'}.  The schema says what each place
# holds, so a string is read back as YAML reads it wherever the schema does not declare a string
# there (a number, a boolean, null, or no declared type, as in mask params and kernel/CP options):
# an override means what the same text means in a config file.
_YAML_SCALARS = (bool, int, float, type(None))
# PyYAML (and so Snakemake's loader) follows YAML 1.1, where a float needs a dot: `1e300` and `5e-3`
# arrive as strings.  YAML 1.2 reads them as floats, and so does this wherever a string does not
# belong: a number-valued key is never silently a string.
_EXPONENT_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)[eE][-+]?[0-9]+")


def restore_types(value: Any, schema: dict) -> Any:
    """``value`` with the strings the schema does not allow as strings read as YAML scalars."""
    alternatives = schema.get("oneOf") or schema.get("anyOf")
    if alternatives:  # the first alternative the restored value satisfies; else leave it to validation
        for alternative in alternatives:
            restored = restore_types(value, alternative)
            if jsonschema.Draft202012Validator(alternative).is_valid(restored):
                return restored
        return value
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        extra = extra if isinstance(extra, dict) else {}
        return {key: restore_types(item, properties.get(key, extra)) for key, item in value.items()}
    if isinstance(value, list):
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", {})
        return [restore_types(item, prefix[i] if i < len(prefix) else items) for i, item in enumerate(value)]
    if isinstance(value, str) and "string" not in _declared_types(schema):
        if _EXPONENT_FLOAT.fullmatch(value.strip()):
            return _whole(float(value), schema)
        try:
            read = yaml.safe_load(value)
        except yaml.YAMLError:
            return value
        return _whole(read, schema) if isinstance(read, _YAML_SCALARS) else value
    return _whole(value, schema)


def _whole(value: Any, schema: dict) -> Any:
    """A float with no fraction where only an integer goes (``seqlens: [1e3]``) as that integer: the
    length means 1000 tokens, and every later message names 1000.  A fraction stays, for the schema
    to name its key."""
    types = _declared_types(schema)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and types == {"integer"}:
        return int(value)
    return value


def _declared_types(schema: dict) -> set[str]:
    declared = schema.get("type", [])
    types = {declared} if isinstance(declared, str) else set(declared)
    if "enum" in schema:  # an enum without a type still says whether strings belong there
        types |= {"string" for choice in schema["enum"] if isinstance(choice, str)}
    return types


def validate(config: dict, schema_path: Path = SCHEMA_PATH) -> dict:
    """Return the config with defaults filled in, or raise ConfigError naming the bad key."""
    schema = load_schema(schema_path)
    config = restore_types(copy.deepcopy(config), schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = [leaf for e in validator.iter_errors(config) for leaf in _specific_errors(e)]
    errors += _non_finite(config)
    if errors:
        lines = sorted(f"{_key_path(e.absolute_path)}: {e.message}{_suggestion(e)}" for e in errors)
        raise ConfigError("invalid LongCA configuration:\n  " + "\n  ".join(lines))
    _apply_defaults(config, schema)
    defaults = DEVICE_DEFAULTS[config["device"]]
    for key, value in defaults["timing"].items():
        config["timing"].setdefault(key, value)
    config.setdefault("isolation", defaults["isolation"])
    _inline_histograms(config)
    _check_semantics(config)
    _select_cp_masks(config)
    return config


def did_you_mean(name: str, known) -> str:
    """' (did you mean 'X'?)' for the known names closest to a misspelt ``name``, or ''."""
    close = difflib.get_close_matches(str(name), sorted(map(str, known)), n=2, cutoff=0.7)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def _suggestion(error: jsonschema.ValidationError) -> str:
    """For a key the schema does not know, the keys it does that are spelt like it."""
    if error.validator != "additionalProperties" or not isinstance(error.instance, dict):
        return ""
    known = error.schema.get("properties", {})
    return "".join(did_you_mean(key, known) for key in error.instance if key not in known)


# The keywords that say an instance has another shape than a oneOf branch expects (a string where an
# object goes, an object without the branch's required key or with a key it excludes).
_SHAPE_KEYWORDS = ("type", "required", "not")


def _specific_errors(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """The errors to show for ``error``: for a ``oneOf``/``anyOf`` ("is not valid under any of the
    given schemas"), the errors of the branch the instance's shape selects (a mask object with
    ``slices`` is a custom mask), each naming its own key and value; otherwise ``error`` itself."""
    if error.validator not in ("oneOf", "anyOf") or not error.context:
        return [error]
    branches: dict[int, list[jsonschema.ValidationError]] = {}
    for sub in error.context:
        branches.setdefault(sub.relative_schema_path[0], []).append(sub)
    root = [[e for e in errs if not e.relative_path and e.validator in _SHAPE_KEYWORDS] for errs in branches.values()]
    if all(any(e.validator == "type" for e in errs) for errs in root):  # no branch takes this type
        types = [t for errs in root for e in errs if e.validator == "type"
                 for t in ([e.validator_value] if isinstance(e.validator_value, str) else e.validator_value)]
        return [jsonschema.ValidationError(f"{error.instance!r} is not of type "
                                           f"{' or '.join(map(repr, dict.fromkeys(types)))}", path=error.absolute_path)]
    # Among the branches that take this type, the one whose required keys the instance has.
    typed = [(errs, len(mismatched)) for errs, mismatched in zip(branches.values(), root)
             if not any(e.validator == "type" for e in mismatched)]
    chosen = min(typed, key=lambda pair: pair[1])[0]
    return [leaf for e in chosen for leaf in _specific_errors(e)]


def _non_finite(value: Any, path: tuple = ()) -> list[jsonschema.ValidationError]:
    """A NaN passes every minimum and maximum: name each non-finite number (``.nan``, ``.inf``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return [jsonschema.ValidationError(f"{value!r} is not a finite number", path=path)]
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [e for key, item in items for e in _non_finite(item, (*path, key))]


# Document-length histograms shipped with LongCA, by the name a config gives as `histogram:`
# (docs/masks.md says where each comes from).  Here, not in varlen.py: a name is resolved to its bins
# when the config is read, so measuring code never sees it (and varlen.py's cache key stays).
SHIPPED_HISTOGRAMS = {
    "magi_cp_docs": varlen.DATA_DIR / "doclen_magi_cp.csv",
    "magi_long_docs": varlen.DATA_DIR / "doclen_magi_long.csv",
}


def _inline_histograms(config: dict) -> None:
    """Replace a histogram file path (or a shipped histogram's name) in a mask's params by the file's
    bins and weights.

    So the cells' settings (their cache key) change when the file's content changes, and a cell
    needs no file at run time (cluster jobs may run elsewhere)."""

    for i, item in enumerate(config["masks"]):
        params = item.get("params", {}) if isinstance(item, dict) else {}
        if isinstance(params.get("histogram"), str):
            source = SHIPPED_HISTOGRAMS.get(params["histogram"], params["histogram"])
            try:
                params["histogram"] = varlen.load_histogram(source).as_dict()
            except ValueError as exc:
                raise ConfigError(f"invalid LongCA configuration:\n  config.masks[{i}].params.histogram: {exc}")


def _check_semantics(config: dict) -> None:
    """What a schema cannot say: names that must exist in registries, and shape constraints."""
    from . import kernels

    problems = []
    known = kernels.names()
    for i, name in enumerate(config["kernels"]):
        if name not in known:
            problems.append(f"config.kernels[{i}]: unknown kernel {name!r}{did_you_mean(name, known)}; "
                            f"known: {', '.join(known)}")
    labels = set()
    for i, entry in enumerate(mask_entries(config)):
        if entry.pattern not in masks.PATTERNS and entry.pattern not in masks.EXTRA_PATTERNS:
            patterns = sorted(masks.PATTERNS) + sorted(masks.EXTRA_PATTERNS)
            problems.append(f"config.masks[{i}]: unknown mask pattern {entry.pattern!r}"
                            f"{did_you_mean(entry.pattern, patterns)}; known: {', '.join(patterns)}")
        else:
            # Parameters are checked by building the mask at every length a cell has (cheap: slices
            # only), each batch's too.
            for seqlen in sorted({shapes.batch_seqlen(config, n, b) for n in config["seqlens"]
                                  for b in shapes.batches(config)}):
                try:
                    masks.build(entry.pattern, seqlen, seed=config["seed"], **head_params(config, entry))
                except ValueError as exc:
                    problems.append(f"config.masks[{i}] ({entry.name}) at seqlen {seqlen}: {exc}")
                    break
            problems += _head_pattern_problems(config, i, entry)
        if entry.name in labels:
            problems.append(f"config.masks[{i}]: mask name {entry.name!r} appears twice")
        labels.add(entry.name)
    for name, options in config["kernel_options"].items():
        if name not in known:
            problems.append(f"config.kernel_options.{name}: unknown kernel {name!r}; known: {', '.join(known)}")
            continue
        try:
            kernels.get(name).with_options(options)
        except ValueError as exc:
            problems.append(f"config.kernel_options.{name}: {exc}")
    problems += _cp_problems(config, labels)
    problems += shapes.problems(config)
    if not labels:
        problems.append("config.masks: no mask, and no model preset (config.models) brings one")
    if config["heads_q"] % config["heads_kv"]:
        problems.append(f"config.heads_q: {config['heads_q']} is not a multiple of "
                        f"config.heads_kv = {config['heads_kv']}")
    if problems:
        raise ConfigError("invalid LongCA configuration:\n  " + "\n  ".join(problems))


def _head_pattern_problems(config: dict, i: int, entry: MaskEntry) -> list[str]:
    """A per-head pattern's heads must be the grid's, its gate length a multiple of its block."""
    if entry.pattern not in masks.HEAD_PATTERNS or config["heads_q"] % config["heads_kv"]:
        return []
    problems = []
    for key, value in _grid_heads(config).items():
        if entry.params.get(key, value) != value:
            problems.append(f"config.masks[{i}] ({entry.name}).params.{key}: {entry.params[key]!r}, but the grid "
                            f"has {value} (heads_q {config['heads_q']}, heads_kv {config['heads_kv']}); leave it out")
    key, default = masks.GATE_MULTIPLE[entry.pattern]
    step = entry.params.get(key, default)
    if config["gate_seqlen"] % step:
        problems.append(f"config.gate_seqlen: {config['gate_seqlen']} is not a multiple of mask "
                        f"{entry.name!r}'s {key} {step} (its gate keeps the {key})")
    if config["cp_strategies"] and (config["cp_masks"] is None or entry.name in config["cp_masks"]):
        problems.append(f"config.cp_masks: {entry.name!r} has a pattern per KV head, which CP strategies do not "
                        "take (they run one mask for every head); list the CP masks without it")
    return problems


def _cp_problems(config: dict, mask_labels: set[str]) -> list[str]:
    from . import cp

    problems = []
    known = cp.names()
    for i, name in enumerate(config["cp_strategies"]):
        if name not in known:
            problems.append(f"config.cp_strategies[{i}]: unknown CP strategy {name!r}{did_you_mean(name, known)}; "
                            f"known: {', '.join(known)}")
    for name, options in config["cp_options"].items():
        if name not in known:
            problems.append(f"config.cp_options.{name}: unknown CP strategy {name!r}; known: {', '.join(known)}")
            continue
        accepted = cp.get(name).options
        for key in sorted(set(options) - set(accepted)):
            problems.append(f"config.cp_options.{name}: unknown option {key!r} "
                            f"(it accepts: {', '.join(sorted(accepted))})")
        for key in sorted(set(options) & set(accepted)):
            if (why := cp.option_problem(name, key, options[key])):
                problems.append(f"config.cp_options.{name}.{key}: {why}")
    # With no strategy the CP axes are unused; a config that narrows `masks` and turns CP off must
    # not fail on the default grid's `cp_masks`.  A pattern name that `masks` leaves out is dropped
    # (_select_cp_masks); a name that is neither is a typo.
    for i, name in enumerate((config["cp_masks"] or []) if config["cp_strategies"] else []):
        if name not in mask_labels and name not in masks.PATTERNS and name not in masks.EXTRA_PATTERNS:
            problems.append(f"config.cp_masks[{i}]: {name!r} is not one of config.masks "
                            f"({', '.join(sorted(mask_labels))}) nor a mask pattern")
    if config["cp_strategies"] and not config["cp_sizes"]:
        problems.append("config.cp_sizes: CP strategies are listed but no CP size")
    # The presets are data (longca/cp_envs.yaml), so the schema takes a string and the name is held here.
    if (why := cp_env.problem(config["cp_env"])):
        problems.append(f"config.cp_env: {why}{did_you_mean(config['cp_env'], cp_env.presets())}")
    return problems


def _select_cp_masks(config: dict) -> None:
    """`cp_masks` selects among `masks`: CP cells run for the masks in both.  A mask pattern that
    `masks` leaves out (the default grid's `causal` under `--config 'masks=[full]'`) is dropped with
    one note naming it, so narrowing `masks` never needs `cp_masks` narrowed too."""
    if not config["cp_strategies"] or config["cp_masks"] is None:
        return
    labels = {e.name for e in mask_entries(config)}
    dropped = [name for name in config["cp_masks"] if name not in labels]
    if dropped:
        config["cp_masks"] = [name for name in config["cp_masks"] if name in labels]
        left = f"CP cells run for {', '.join(config['cp_masks'])}" if config["cp_masks"] else "no CP cells"
        print(f"longca: cp_masks {', '.join(dropped)} not in masks, so no CP cells for "
              f"{'it' if len(dropped) == 1 else 'them'} ({left})", file=sys.stderr)


def cp_cells(config: dict) -> Iterator[CPCell]:
    # null: every mask; a list selects (empty when every name in it was dropped: no CP cells).
    masks_ = [e.name for e in _entries(config["masks"])] if config["cp_masks"] is None else config["cp_masks"]
    tokens = config["cp_tokens_per_rank"] or config["seqlens"]
    # `cp_layouts` more document layouts for a mask whose documents are drawn (not given).
    drawn = {e.name for e in mask_entries(config)
             if e.pattern in masks.DOCUMENT_PATTERNS and "documents" not in e.params}
    for strategy, mask, n, size, direction, dtype in itertools.product(
            config["cp_strategies"], masks_, tokens, config["cp_sizes"], config["directions"], config["dtypes"]):
        for layout in range(config["cp_layouts"] if mask in drawn else 1):
            yield CPCell(strategy, layout_mask(mask, layout), n, size, direction, dtype)


def cp_cell_settings(config: dict, strategy: str, mask: str, tokens_per_rank: int, cp_size: int,
                     direction: str, dtype: str) -> dict:
    """Exactly the resolved settings that determine one CP cell's number (its cache key).  A cell of
    layout i (``<mask>~layout<i>``) is its mask's with seed + i."""
    base, layout = split_layout(mask)
    entry = {e.name: e for e in mask_entries(config)}[base]
    settings = {
        "strategy": strategy, "mask": mask, "pattern": entry.pattern, "mask_params": entry.params,
        "seqlen": cp_seqlen(int(tokens_per_rank), int(cp_size)), "cp_size": int(cp_size), "direction": direction,
        "dtype": dtype, **problem_settings.grid_settings(config), "seed": config["seed"] + layout,
        "gate_seqlen": config["gate_seqlen"], **timing_spec.cp_settings(config["timing"]),
    }
    options = config.get("cp_options", {}).get(strategy)
    if options:
        settings["strategy_options"] = options
    if config.get("ranks_per_node"):
        settings["ranks_per_node"] = min(int(config["ranks_per_node"]), int(cp_size))
    settings.update(cp_env.settings_entry(config.get("cp_env", cp_env.DEFAULT)))  # default: none, key as before
    if config.get("cp_exposed_comm"):  # only when on: every other cell keeps its key
        settings["cp_exposed_comm"] = True
    return settings


def slurm_resources(config: dict) -> dict:
    """Partition and account for every job, from config or the environment (absent when neither)."""
    import os

    out = {}
    for key, env in (("slurm_partition", "LONGCA_SLURM_PARTITION"), ("slurm_account", "LONGCA_SLURM_ACCOUNT")):
        value = config.get(key) or os.environ.get(env)
        if value:
            out[key] = value
    return out


@dataclass(frozen=True)
class GridMask:
    """A mask at one shape: what a kernel cell's ``mask`` names (``label``: the mask's name, with the
    shape's mark where the shape is not the grid's own), and the model presets it serves."""
    label: str
    entry: MaskEntry
    shape: Shape
    models: tuple[str, ...] = ()


def grid_masks(config: dict) -> list[GridMask]:
    """Every (mask, shape) of the grid: the config's ``masks`` at each shape of the shape axes, then
    each model preset's masks at its shape; one per label, with every preset that names it."""
    entries = {e.name: e for e in mask_entries(config)}
    own = shapes.grid_shape(config)
    pairs = [(entries[e.name], shape, None) for shape in shapes.axis_shapes(config) for e in _entries(config["masks"])]
    pairs += [(entries[e.name], shape, model.name) for model in shapes.models(config)
              for shape in shapes.model_shapes(config, model) for e in _entries(model.masks)]
    out: dict[str, GridMask] = {}
    for entry, shape, model in pairs:
        label = shaped_mask(entry.name, shape, own)
        known = out.get(label) or GridMask(label, entry, shape)
        out[label] = GridMask(label, entry, shape, known.models + ((model,) if model and model not in known.models else ()))
    return list(out.values())


def label_models(config: dict) -> dict[str, list[str]]:
    """The model presets each kernel cell's mask label serves (labels of no preset left out): the
    tables' ``model`` column."""
    return {gm.label: list(gm.models) for gm in grid_masks(config) if gm.models}


def kernel_cells(config: dict) -> Iterator[KernelCell]:
    for kernel, gm, seqlen, direction, dtype in itertools.product(
            config["kernels"], grid_masks(config), config["seqlens"], config["directions"], config["dtypes"]):
        yield KernelCell(kernel, gm.label, shapes.batch_seqlen(config, seqlen, gm.shape.batch), direction, dtype)


def named_cells(config: dict, names: list[str]) -> list[KernelCell]:
    """The grid's cells of these names, in their order; names that are no cell of it are an error
    naming each of them."""
    by_name = {c.name: c for c in kernel_cells(config)}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        example = next(iter(by_name), "kernel/mask/bfloat16_fwd_4096")
        raise ConfigError(f"not cells of this grid: {', '.join(unknown)} (a cell is named like {example})")
    return [by_name[n] for n in names]


def _grid_heads(config: dict) -> dict:
    """A per-head pattern's ``heads`` and ``group`` (query heads per KV head) as the grid has them."""
    return {"heads": config["heads_kv"], "group": config["heads_q"] // config["heads_kv"]}


def head_params(config: dict, entry: MaskEntry) -> dict:
    """A mask entry's parameters, with a per-head pattern's ``heads`` and ``group`` from the grid's
    ``heads_kv`` and ``heads_q`` (``masks.HEAD_PATTERNS``) unless the entry gives them."""
    if entry.pattern not in masks.HEAD_PATTERNS:
        return entry.params
    return {**_grid_heads(config), **entry.params}


def cell_settings(config: dict, kernel: str, mask: str, seqlen: int, direction: str, dtype: str) -> dict:
    """Exactly the resolved settings that determine one kernel cell's number (its cache key).  ``mask``
    is the cell's (a label of ``grid_masks``); its shape's fields override the grid's."""
    grid_mask = {gm.label: gm for gm in grid_masks(config)}[mask]
    # The shape's fields (head_dim_v only where set: grid_settings leaves an unset one out of the key).
    entry, config = grid_mask.entry, {**config, "head_dim_v": None, **grid_mask.shape.settings()}
    settings = {
        "kernel": kernel, "mask": mask, "pattern": entry.pattern, "mask_params": head_params(config, entry),
        "seqlen": int(seqlen), "direction": direction, "dtype": dtype, **problem_settings.grid_settings(config),
        "gate_seqlen": config["gate_seqlen"], **timing_spec.kernel_settings(config["timing"]),
    }
    # Only when set: a kernel without options keeps the cache key it had before options existed.
    options = config.get("kernel_options", {}).get(kernel)
    if options:
        settings["kernel_options"] = options
    return settings


def cell_limits(config: dict) -> str:
    """``run-cell`` flags for the per-cell limits and isolation (not part of any cache key)."""
    limits = config["limits"]
    return (f"--isolation {config['isolation']} --timeout {limits['cell_timeout_s']:g} "
            f"--memory-mb {limits['cell_memory_mb'] or 0} --gpus {config['gpus']}")
