"""Plumbing (a reader of the method may skip this file): the scripts' command line and error style.

Flags come from the settings dataclasses (CleanRL's habit: one field, one line of doc, one flag);
presets are nanoGPT-style Python files of assignments (config/*.py), which run when they are read.
User errors print one line.
"""
import argparse
import difflib
import ast
import inspect
import math
import os
import re
import runpy
import sys
import types
import typing
from dataclasses import fields, is_dataclass
from pathlib import Path

import torch.distributed as dist


def field_docs(cls) -> dict[str, str]:
    """The docstring under each dataclass field (CleanRL's convention), for --help; a field a base
    dataclass declares has its docstring there."""
    docs = {}
    for owner in reversed([c for c in cls.__mro__ if is_dataclass(c)]):
        body = ast.parse(inspect.getsource(owner)).body[0].body     # that class's own source
        for stmt, nxt in zip(body, body[1:]):
            if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) \
                    and isinstance(nxt.value, ast.Constant):
                docs[stmt.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def field_groups(cls) -> list[tuple[str, list]]:
    """(title, fields) for --help: the class's own fields, then each base dataclass's (sft.py's and
    rl.py's Args take the --eval_* flags from measure.ValidationArgs), titled by the first line
    of the docstring of the class that declares them."""
    groups, seen = [], set()
    for owner in [c for c in cls.__mro__ if is_dataclass(c)]:
        doc = (owner.__doc__ or "").strip()            # a dataclass without one gets its signature
        title = owner.__name__ if doc.startswith(owner.__name__ + "(") else doc.splitlines()[0]
        declared = [f for f in fields(cls)
                    if f.name in inspect.get_annotations(owner) and f.name not in seen]
        seen |= {f.name for f in declared}
        groups.append((title, declared))
    return groups


def _converter(annotation):
    """str -> value for a field type; `X | None` fields take "none"; Literal fields take one of
    their values."""
    if isinstance(annotation, types.UnionType):
        inner = next(a for a in annotation.__args__ if a is not type(None))
        return lambda v: None if v.lower() == "none" else _converter(inner)(v)
    if typing.get_origin(annotation) is typing.Literal:
        return str
    return annotation


def _type_ok(value, annotation) -> bool:
    """Does a preset's value have the field's type? (runpy gives python values: "False" is a str,
    1.5 no int)"""
    if isinstance(annotation, types.UnionType):
        return any(_type_ok(value, a) for a in annotation.__args__)
    if annotation is type(None):
        return value is None
    if typing.get_origin(annotation) is typing.Literal:
        return value in typing.get_args(annotation)
    if isinstance(annotation, types.GenericAlias):             # list[str]
        return isinstance(value, list) and all(_type_ok(v, annotation.__args__[0]) for v in value)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, annotation)


_NUMBER = re.compile(r"-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?|-inf|-nan")


class _HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the usage examples of a script's docstring as written, and shows each flag's default
    (none for an empty one: "(default: )" says nothing)."""

    def _get_help_string(self, action):
        if action.default in ("", None, [], ()):
            return action.help
        return super()._get_help_string(action)


def did_you_mean(path: str) -> str:
    """", did you mean X?" for the closest .py file beside a mistyped preset's path, or ""."""
    folder = Path(path).parent
    names = [p.name for p in folder.glob("*.py")] if folder.is_dir() else []
    close = difflib.get_close_matches(Path(path).name, names, n=1, cutoff=0.6)
    return f", did you mean {folder / close[0]}?" if close else ""


def split_presets(argv: list[str], classes) -> tuple[list[str], list[str]]:
    """(presets, the other words) of a command line. A word ending in .py is a preset wherever it
    stands, unless it is the value of a flag of the classes that takes one value; `--config FILE`
    (TRL's and open-r1's habit) names one too."""
    kinds = {f.name: f.type for cls in classes for f in fields(cls)}
    presets, rest, i = [], [], 0
    while i < len(argv):
        word = argv[i]
        name = word[2:].replace("-", "_") if word.startswith("--") and "=" not in word else None
        one_value = name in kinds and kinds[name] is not bool \
            and not isinstance(kinds[name], types.GenericAlias)
        if name == "config" and i + 1 < len(argv):
            presets.append(argv[i + 1])
            i += 2
        elif one_value and i + 1 < len(argv):
            rest += argv[i : i + 2]
            i += 2
        else:
            if word.startswith("--config="):
                presets.append(word.partition("=")[2])
            elif word.endswith(".py"):
                presets.append(word)
            else:
                rest.append(word)
            i += 1
    return presets, rest


def parse_config(*classes, argv=None, prog=None):
    """Instances of the given dataclasses from presets and `--field value` flags, in any order.
    Presets (config/*.py, or --config FILE) are python files of plain assignments applied in the
    order given, later ones winning; flags win over every preset wherever they stand. Bool fields
    are --flag / --no-flag, list fields take several values, Literal fields list their choices;
    names may use - or _. Unknown names, renamed ones (a class's RENAMED: {old: new}), values of the
    wrong type and missing required flags (a class's REQUIRED) are one-line errors; each class's
    __post_init__ checks ranges (check_settings)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    renamed = {old: new for cls in classes for old, new in getattr(cls, "RENAMED", {}).items()}
    presets, argv = split_presets(argv, classes)
    for word in argv:
        old = word[2:].partition("=")[0].replace("-", "_") if word.startswith("--") else None
        if old in renamed:
            raise SystemExit(f"{word.partition('=')[0]}: renamed --{renamed[old]}")
    overrides, origin = {}, {}
    for path in presets:
        if not Path(path).is_file():
            raise SystemExit(f"preset {path}: no such file{did_you_mean(path)}")
        preset = {k: v for k, v in runpy.run_path(path).items() if not k.startswith("_")}
        for old in preset.keys() & renamed.keys():
            raise SystemExit(f"preset {path}: setting {old!r} was renamed {renamed[old]!r}")
        overrides |= preset
        origin |= dict.fromkeys(preset, path)
    # argparse reads "-1e-3" as a flag (only "-1" and "-.5" pass as numbers): glue such values to
    # their flag
    for i in range(len(argv) - 1, 0, -1):
        if _NUMBER.fullmatch(argv[i]) and argv[i - 1].startswith("--") and "=" not in argv[i - 1]:
            argv[i - 1 : i + 1] = [f"{argv[i - 1]}={argv[i]}"]
    prog = prog or Path(sys.argv[0]).name
    parser = argparse.ArgumentParser(prog=prog, description=sys.modules["__main__"].__doc__,
                                     usage=f"{prog} [config/PRESET.py ...] [--flag value ...]",
                                     formatter_class=_HelpFormatter)
    names, required = {}, []
    for cls in classes:
        docs, defaults = field_docs(cls), cls()
        for title, group_fields in field_groups(cls):
            group = parser.add_argument_group(title)
            for f in group_fields:
                names[f.name] = f.type
                flags = list(dict.fromkeys([f"--{f.name}", f"--{f.name.replace('_', '-')}"]))
                need = f.name in getattr(cls, "REQUIRED", ()) and f.name not in overrides
                required += [f.name] if need else []
                kw = {"dest": f.name, "default": overrides.get(f.name, getattr(defaults, f.name)),
                      "help": ("(required) " if need else "") + docs.get(f.name, "")}
                if f.type is bool:
                    group.add_argument(*flags, action=argparse.BooleanOptionalAction, **kw)
                elif isinstance(f.type, types.GenericAlias):  # list[str]
                    group.add_argument(*flags, nargs="*", type=_converter(f.type.__args__[0]),
                                       **kw)
                else:
                    literal = typing.get_origin(f.type) is typing.Literal
                    choices = typing.get_args(f.type) if literal else None
                    group.add_argument(*flags, type=_converter(f.type), choices=choices, **kw)
    for k, v in overrides.items():
        if k not in names:
            raise SystemExit(f"preset {origin[k]}: unknown setting {k!r}")
        if not _type_ok(v, names[k]):
            kind = getattr(names[k], "__name__", names[k])
            raise SystemExit(f"preset {origin[k]}: {k} = {v!r} is not of type {kind}")
    ns = vars(parser.parse_args(argv))
    missing = [f"--{k}" for k in required if ns[k] in ("", None, [])]
    if missing:
        parser.error(f"required: {', '.join(missing)}")
    return [cls(**{f.name: ns[f.name] for f in fields(cls)}) for cls in classes]


def check_settings(config, positive=(), non_negative=(), fraction=(), at_least_one=()) -> None:
    """For a settings dataclass's __post_init__: a one-line SystemExit naming the flag when a
    Literal field is not one of its choices or a setting is out of range (NaN fails every range)."""
    def fail(name, rule):
        raise SystemExit(f"--{name} {getattr(config, name)!r}: {rule}")
    for f in fields(config):
        choices = typing.get_args(f.type) if typing.get_origin(f.type) is typing.Literal else ()
        if choices and getattr(config, f.name) not in choices:
            fail(f.name, f"expected one of {', '.join(map(str, choices))}")
    for name in positive:
        v = getattr(config, name)
        if v is not None and not (math.isfinite(v) and v > 0):
            fail(name, "must be a finite number > 0")
    for name in non_negative:
        v = getattr(config, name)
        if v is not None and not (math.isfinite(v) and v >= 0):
            fail(name, "must be a finite number >= 0")
    for name in fraction:
        v = getattr(config, name)
        if v is not None and not 0 <= v <= 1:
            fail(name, "must be in [0, 1]")
    for name in at_least_one:
        if not getattr(config, name) >= 1:
            fail(name, "must be >= 1")


def run_script(main) -> None:
    """Run a stage script's main() with one error style: a user error (a SystemExit with a message,
    or a FileNotFoundError / ValueError, which the loaders raise naming the file, row or field)
    prints one line and exits 1. Bugs keep their traceback; CURIOSFT_DEBUG=1 shows it for user
    errors too. Every exit leaves without the interpreter's teardown (plumbing/distributed.shutdown
    says why), and other ranks may be blocked in a collective: torchrun then stops them."""
    try:
        main()
    except SystemExit as e:                  # a one-line refusal, argparse's usage error, or --help
        code = e.code
        if isinstance(code, str):
            print(code, file=sys.stderr)
        _exit(1 if isinstance(code, str) else code or 0)
    except (FileNotFoundError, ValueError) as e:
        if os.environ.get("CURIOSFT_DEBUG") == "1":
            raise
        several = dist.is_initialized() and dist.get_world_size() > 1
        rank = f"[rank {dist.get_rank()}] " if several else ""
        print(f"{rank}{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        _exit(1)
    except KeyboardInterrupt:
        # Ctrl-C where nothing could be saved (the trainers save at the next step end; a second
        # Ctrl-C lands here)
        if os.environ.get("CURIOSFT_DEBUG") == "1":
            raise
        print(f"{Path(sys.argv[0]).name}: interrupted; files are written whole or not at all: the "
              "same command resumes from what was saved", file=sys.stderr)
        _exit(130)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
