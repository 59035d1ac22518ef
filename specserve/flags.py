"""Command-line flags derived from typed config dataclasses: a field's name gives its flag, its type the
parser, its attribute docstring (first sentence) the help. No flag holds a default: one not given is None,
so the dataclass (or a config file the flags override) keeps the one default there is."""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

FLAG_METADATA = "flag"
"""The key of a field's metadata that tunes its flag: `field(default=..., metadata=flag(...))`."""

NO_FLAG: dict[str, None] = {FLAG_METADATA: None}
"""Field metadata for a setting the command line must not carry (a secret; a structure)."""
SCALARS: dict[str, Callable[[str], object]] = {"int": int, "float": float, "str": str}
# a sentence ends at a full stop before a space, but not that of "e.g.", "i.e.", "vs." or an ellipsis
SENTENCE_END = re.compile(r"(?<!e\.g)(?<!i\.e)(?<!\bvs)(?<!\.\.)\.(?=\s|$)")


@dataclasses.dataclass(frozen=True, slots=True)
class FlagSpec:
    """How one field's flag departs from what its name and type give."""

    names: tuple[str, ...] = ()
    """Option strings used instead of `--field-name` (the first names the flag in messages), e.g. ("-k",
    "--num-speculative-tokens"). A bool field's `--no-...` forms follow each long name."""
    help: str | None = None
    """Instead of the docstring's first sentence."""
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    one_per_flag: bool = False
    """A tuple field: one value per flag, the flag repeated for more (`--stop a --stop b`), so that a
    positional argument may follow it."""


def flag(*names: str, help: str | None = None, choices: Sequence[str] | None = None, metavar: str | None = None,
         one_per_flag: bool = False) -> dict[str, FlagSpec]:  # fmt: skip
    """Field metadata for a flag that departs from the field's name, docstring or type."""
    return {FLAG_METADATA: FlagSpec(tuple(names), help, tuple(choices) if choices else None, metavar, one_per_flag)}


def add_config_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    only: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    prefix: str = "",
    defaults: object = None,
    required: Iterable[str] = (),
) -> list[str]:
    """Add one flag per field of `cls` (those in `only`, in that order, else every field the command line can
    hold, less `skip`); returns the field names. `prefix` (e.g. "target-") goes before each derived flag name
    and, as "target_", before each dest. `defaults` (an instance) shows other defaults than the class's in
    the help. `required`: fields this command cannot do without (beside those with no default). Raises
    TypeError where `only` names a field whose type no flag parses."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    names = list(only) if only is not None else [n for n, f in fields.items() if _has_flag(f)]
    added = [name for name in names if name not in skip]
    for name in added:
        field = fields[name]
        no_default = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        default = getattr(defaults, name) if defaults is not None else _class_default(field)
        _add_flag(parser, cls, field, prefix, default, required=no_default or name in required)
    return added


def _add_flag(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, field: dataclasses.Field[Any],
              prefix: str, default: object, required: bool) -> None:  # fmt: skip
    kind = _parser_of(field)
    if kind is None:
        raise TypeError(f"{cls.__name__}.{field.name}: no command-line flag parses {field.type}")
    spec: FlagSpec = field.metadata.get(FLAG_METADATA) or FlagSpec()
    option_strings = _option_strings(spec, field.name, prefix)
    text = _help(spec.help or field_docs(cls).get(field.name, ""), None if required else default)
    if spec.choices and spec.metavar:  # the metavar keeps the usage short: the choices go here
        text += " Choices: " + ", ".join(map(repr, spec.choices)) + "."
    dest = prefix.replace("-", "_") + field.name
    if kind is bool:
        parser.add_argument(*option_strings, dest=dest, action=argparse.BooleanOptionalAction, help=text)
        return
    # a tuple takes values after its flag, and more after the flag again: --ks 2 4 --ks 8
    many = {"nargs": "+", "action": "extend"} if str(field.type).startswith("tuple[") else {}
    many = {"action": "append"} if spec.one_per_flag else many
    metavar = spec.metavar or (None if spec.choices else _metavar(field.name, kind))
    parser.add_argument(*option_strings, dest=dest, type=kind, choices=spec.choices, metavar=metavar,
                        required=required, help=text, **many)  # type: ignore[arg-type]  # fmt: skip


def given_values(args: argparse.Namespace, names: Iterable[str], prefix: str = "") -> dict[str, Any]:
    """{field: value} for the flags of `names` that were given (tuples for repeated values)."""
    values = {}
    for name in names:
        value = getattr(args, prefix.replace("-", "_") + name, None)
        if value is not None:
            values[name] = tuple(value) if isinstance(value, list) else value
    return values


def build_from_flags(cls: type, args: argparse.Namespace, names: Iterable[str] | None = None, prefix: str = "",
                     **base: Any) -> Any:  # fmt: skip
    """`cls(**base | given)`: the flags of `names` (default: every field with a flag) that were given, over
    `base`, over the class's defaults. Raises what the class's validation raises (ValueError)."""
    if names is None:
        names = [f.name for f in dataclasses.fields(cls) if _has_flag(f)]
    return cls(**base | given_values(args, names, prefix))


def flags_for(config: object, names: Iterable[str] | None = None) -> list[str]:
    """The command line that add_config_flags' parser reads back as `config` (the fields of `names`, default
    every field with a flag): what a launcher writes for a process it starts. Raises ValueError for an empty
    tuple where the field's default is not empty (a flag takes at least one value)."""
    fields = {f.name: f for f in dataclasses.fields(config)}  # type: ignore[arg-type]
    argv: list[str] = []
    for name in names if names is not None else [n for n, f in fields.items() if _has_flag(f)]:
        value = getattr(config, name)
        spec: FlagSpec = fields[name].metadata.get(FLAG_METADATA) or FlagSpec()
        option = next(o for o in _option_strings(spec, name, "") if o.startswith("--"))
        if isinstance(value, bool):
            argv.append(option if value else "--no-" + option.removeprefix("--"))
        elif isinstance(value, tuple) and not value:
            if _class_default(fields[name]) != ():
                raise ValueError(f"{name}: no command line says () where the default is not empty")
        elif isinstance(value, tuple) and spec.one_per_flag:
            argv += [part for item in value for part in (option, str(item))]
        elif isinstance(value, tuple):
            argv += [option, *map(str, value)]
        elif value is not None:
            argv += [option, str(value)]
    return argv


@functools.cache
def field_docs(cls: type) -> Mapping[str, str]:
    """{field: its attribute docstring} from the class's source ({} where the source is not shipped)."""
    for node in _module_classes(cls.__module__):
        if node.name == cls.__qualname__:
            return _attribute_docs(node)
    return {}


@functools.cache
def _module_classes(module_name: str) -> list[ast.ClassDef]:
    # ast over the module's file: inspect.getsource tokenizes in Python, ten times slower at CLI start
    path = getattr(sys.modules.get(module_name), "__file__", None)
    try:
        with open(path or "", encoding="utf-8") as file:
            tree = ast.parse(file.read())
    except (OSError, SyntaxError):
        return []
    return [node for node in tree.body if isinstance(node, ast.ClassDef)]


def _attribute_docs(node: ast.ClassDef) -> dict[str, str]:
    docs = {}
    for statement, following in zip(node.body, node.body[1:], strict=False):
        if not (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)):
            continue
        if isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            if isinstance(following.value.value, str):
                docs[statement.target.id] = following.value.value
    return docs


def first_sentence(text: str) -> str:
    text = " ".join(text.split())
    end = SENTENCE_END.search(text)
    return text[: end.end()] if end else text


def _help(doc: str, default: object) -> str:
    text = first_sentence(doc)
    if default is not None and default != ():
        shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
        shown = ("on" if default else "off") if isinstance(default, bool) else shown
        text = f"{text} (default: {shown})" if text else f"default: {shown}"
    return text.replace("%", "%%") or "(undocumented)"


def _option_strings(spec: FlagSpec, name: str, prefix: str) -> list[str]:
    names = spec.names or ("--" + name.replace("_", "-"),)
    if not prefix:
        return list(names)
    return ["--" + prefix + n.removeprefix("--") for n in names if n.startswith("--")]


def _metavar(name: str, kind: Callable[[str], object]) -> str:
    if name.endswith("_s"):
        return "SECONDS"
    return {int: "N", float: "X"}.get(kind, name.upper())  # type: ignore[call-overload]


def _class_default(field: dataclasses.Field[Any]) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return None


def _has_flag(field: dataclasses.Field[Any]) -> bool:
    return field.metadata.get(FLAG_METADATA, FlagSpec()) is not None and _parser_of(field) is not None


def _parser_of(field: dataclasses.Field[Any]) -> Callable[[str], object] | None:
    """The parser of one command-line value of the field: int, float, str or bool (a switch); None where the
    type is no scalar, an optional scalar or a tuple of scalars."""
    type_name = str(field.type).removesuffix(" | None")
    if type_name == "bool":
        return bool
    if type_name.startswith("tuple[") and type_name.endswith(", ...]"):
        type_name = type_name.removeprefix("tuple[").removesuffix(", ...]")
    return SCALARS.get(type_name)
