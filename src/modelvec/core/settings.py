"""Settings declared once, as data: a dataclass field carries its help, allowed values and bounds.

A settings class (the representation, ...) declares each field with :func:`setting`; its
``__post_init__`` calls :func:`validate`, so a value is checked once, where it enters, whatever
the caller (the API, the CLI, a stored key). The command line builds its options from the same
fields (:func:`settings_of`), so adding a setting is adding one field.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

_KEY = "modelvec.setting"
_WHAT = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}  # a kind in words


@dataclass(frozen=True, kw_only=True)
class Setting:
    """What a field means to a user: its help, the values it allows, and its command-line flag.

    ``choices``: the allowed strings, or a function that lists them when asked (a registry that grows after the
    class is declared: the run's engines). ``minimum`` / ``maximum``: inclusive bounds of a number;
    ``above``: an exclusive lower bound. ``words``: strings a number also takes in its place (``"auto"``), and
    ``kind``: that number's type where the default is one of them or ``None`` (a field whose default is ``None``
    also takes ``None``: "no limit"); ``also``: other types a value may have, taken as they are (a Hub token: a
    string, or ``False`` for none). ``many``: the value is a tuple of such values, each checked (the command line
    takes them repeated or comma-separated). ``flag``: the option's name (default ``--field-name``); ``negation``:
    for a bool, the flag that turns it off (default ``--no-field-name``).

    For settings whose object is named by a key (:func:`key_of`, e.g. a stored representation): ``key``, how
    the value reads in it (a format, ``"r{}"``; for a bool, the tag it adds when true), ``order``, its place,
    ``tags``, a value's own tag in place of the format, ``omit``, values left out of the key, ``applies``, whether
    the object uses it at all, and ``until_added``, for a setting added after objects were first named by keys, the
    value that computes what was computed before it existed (one value, as a 1-tuple; ``()``: there from the start).
    A key once stored must keep naming what it named: that value is one ``omit`` leaves out (``check_key_history``),
    and the keys each version had are data pinned by tests (``KEY_HISTORY`` in :mod:`modelvec.represent`).
    """

    help: str
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    minimum: float | None = None
    maximum: float | None = None
    above: float | None = None
    words: tuple[str, ...] = ()
    kind: type | None = None
    also: tuple[type, ...] = ()
    many: bool = False
    flag: str | None = None
    negation: str | None = None
    metavar: str | None = None
    key: str | None = None
    order: int = 0
    tags: tuple[tuple[str, str], ...] = ()
    omit: tuple[Any, ...] = ()
    applies: Callable[[Any], bool] | None = None
    until_added: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if len(self.until_added) > 1:
            raise ValueError(f"until_added is one value (a 1-tuple), not {self.until_added!r}")
        if self.until_added and self.until_added[0] not in self.omit:  # else every key stored before it would change
            raise ValueError(
                f"until_added={self.until_added[0]!r} must be left out of the key (omit), or the keys stored before "
                "the setting existed would name other vectors"
            )


def until_added(cls: Any) -> dict[str, Any]:
    """The value each setting of ``cls`` added after keys were first stored takes in a key stored before it existed
    (its ``until_added``): what reading such a key back fills in."""
    return {field.name: meta.until_added[0] for field, meta in settings_of(cls) if meta.until_added}


def setting(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with its :class:`Setting` (``setting(8, "Width r ...", minimum=1)``)."""
    return dataclasses.field(default=default, metadata={_KEY: Setting(help=help, **meta)})


def setting_from(factory: Callable[[], Any], help: str, **meta: Any) -> Any:
    """A dataclass field whose default is ``factory()``, read when each object is made (an environment variable's,
    which a run may set after import); its ``kind`` must be declared."""
    if meta.get("kind") is None:
        raise TypeError("setting_from needs the values' kind")
    return dataclasses.field(default_factory=factory, metadata={_KEY: Setting(help=help, **meta)})


def settings_of(cls: Any) -> list[tuple[dataclasses.Field, Setting]]:
    """The fields of a settings class (or instance) declared with :func:`setting`, in order."""
    return [(f, f.metadata[_KEY]) for f in dataclasses.fields(cls) if _KEY in f.metadata]


def kind_of(field: dataclasses.Field, meta: Setting) -> type:
    """The type of a field's values (each value's, for ``many``; where the default is a word or ``None``: its
    declared ``kind``)."""
    if meta.kind is not None:
        return meta.kind
    default: Any = field.default
    return type(default[0]) if meta.many else type(default)


def choices_of(meta: Setting) -> tuple[str, ...]:
    """The allowed strings of a setting, as they are now (a registry's: its names at this moment)."""
    return meta.choices() if callable(meta.choices) else meta.choices


def parse_value(field: dataclasses.Field, meta: Setting, text: str) -> Any:
    """A command line's text as the value of a field: one of its words (``--rows auto``) or its kind's
    (``--rows 0.1``); for ``many``, the tuple of its comma-separated values; raises ``ValueError`` saying what it
    allows."""
    if meta.many:
        single = dataclasses.replace(meta, many=False)
        return tuple(parse_value(field, single, part.strip()) for part in text.split(",") if part.strip())
    if text in meta.words:
        return text
    kind = kind_of(field, meta)
    try:
        return kind(text)
    except ValueError:
        allowed = bounds_text(meta)
        if not meta.words and kind in (int, float):  # "a number in (0, 1]", not just "in (0, 1]"
            allowed = f"{_WHAT[kind]} {allowed}".strip()
        raise ValueError(f"{field.name} must be {allowed}, not {text!r}") from None


def flag_of(field: dataclasses.Field, meta: Setting) -> str:
    return meta.flag or "--" + field.name.replace("_", "-")


def bounds_text(meta: Setting) -> str:
    """The allowed values in words: ``one of a, b``, ``>= 1``, ``in (0, 1]``."""
    if meta.many:
        return "values each " + bounds_text(dataclasses.replace(meta, many=False))
    if meta.choices:
        return "one of " + ", ".join(choices_of(meta))
    if meta.words:  # "a number in (0, 1] or auto"
        number = bounds_text(dataclasses.replace(meta, words=()))
        return " ".join(filter(None, ("a number", number, "or", " or ".join(meta.words))))
    low = f"({meta.above:g}" if meta.above is not None else (f"[{meta.minimum:g}" if meta.minimum is not None else "")
    if meta.maximum is not None:
        return f"in {low or '(-inf'}, {meta.maximum:g}]"
    if meta.above is not None:
        return f"> {meta.above:g}"
    return f">= {meta.minimum:g}" if meta.minimum is not None else ""


def check_field(cls: Any, name: str, value: Any) -> Any:
    """``value`` checked against the declaration of ``cls``'s field ``name`` (its type, choices and bounds) as
    :func:`validate` checks it: for functions that take a setting loose. Returns it (an int as a float for a
    float field)."""
    field, meta = next((f, m) for f, m in settings_of(cls) if f.name == name)
    return _checked(field, meta, value)


F = TypeVar("F", bound=Callable[..., Any])


def validate_params(**checks: Any) -> Callable[[F], F]:
    """A decorator that checks a function's parameters where it is called, as scikit-learn's ``validate_params``:
    each keyword names a parameter and how it is checked, either a settings class (as its field of that name:
    :func:`check_field`) or a function ``check(name, value)`` that returns the value checked or raises a
    ``ValueError`` in one line. The function gets the checked values; ``None`` where the parameter's default is
    ``None`` is not checked (no row left out, ...)."""

    def decorate(func: F) -> F:
        signature = inspect.signature(func)
        unknown = sorted(set(checks) - set(signature.parameters))
        if unknown:
            raise TypeError(f"{func.__name__}() has no parameter {unknown[0]!r} to check")

        @functools.wraps(func)
        def checked(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            for name, check in checks.items():
                value = bound.arguments[name]
                if value is None and signature.parameters[name].default is None:
                    continue
                bound.arguments[name] = (
                    check_field(check, name, value) if isinstance(check, type) else check(name, value)
                )
            return func(*bound.args, **bound.kwargs)

        return cast(F, checked)

    return decorate


def validate(obj: Any) -> None:
    """Check every declared field of a (frozen) settings dataclass: type, choices and bounds.

    An int given for a float field is stored as a float (``rows=1`` is ``1.0``), so equal
    settings compare and print equal. Raises ``ValueError`` naming the field and what it allows.
    """
    for field, meta in settings_of(obj):
        value = getattr(obj, field.name)
        checked = _checked(field, meta, value)
        if checked is not value:
            object.__setattr__(obj, field.name, checked)


def _checked(field: dataclasses.Field, meta: Setting, value: Any) -> Any:
    if value is None and field.default is None:  # "none": no limit, the cluster's own, ...
        return value
    if type(value) in meta.also:
        return value
    if meta.many:  # a tuple, each value checked as one
        single = dataclasses.replace(meta, many=False)
        if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list)) or not value:
            raise ValueError(f"{field.name} must be one or more values, each {bounds_text(single)}, not {value!r}")
        return tuple(_checked(field, single, v) for v in value)
    kind = kind_of(field, meta)
    if meta.words and isinstance(value, str):
        if value in meta.words:
            return value
        raise ValueError(f"{field.name} must be {bounds_text(meta)}, not {value!r}")
    if kind is float and type(value) is int:
        value = float(value)
    if kind is int and type(value) is not bool and isinstance(value, int):
        value = int(value)  # an integer type of numpy's is an int
    if type(value) is not kind:
        if meta.words:
            raise ValueError(f"{field.name} must be {bounds_text(meta)}, not {value!r}")
        what = " or ".join(_WHAT.get(k, k.__name__) for k in (kind, *meta.also))
        raise ValueError(f"{field.name} must be {what}, not {value!r}")
    allowed = bounds_text(meta)
    if meta.choices and value not in choices_of(meta):
        raise ValueError(f"{field.name} must be {allowed}, not {value!r}")
    if kind in (int, float):
        number = float(value) if isinstance(value, (int, float)) else float("nan")
        if not (
            (meta.minimum is None or number >= meta.minimum)
            and (meta.maximum is None or number <= meta.maximum)
            and (meta.above is None or number > meta.above)
            and number == number  # NaN is in no range
        ):
            what = _WHAT[kind]
            allowed = allowed if meta.words else f"{what} {allowed}"
            raise ValueError(f"{field.name} must be {allowed}, not {value!r}")
    return value


def key_of(obj: Any) -> str:
    """The readable id of a settings object, from its fields' ``key`` declarations, joined by ``-`` in their
    ``order``: only what the object uses, so equal keys mean equal computations."""
    parts = []
    for field, meta in sorted(settings_of(obj), key=lambda fm: fm[1].order):
        value = getattr(obj, field.name)
        if meta.key is None or value in meta.omit or (meta.applies is not None and not meta.applies(obj)):
            continue
        if isinstance(value, bool):
            if value:
                parts.append(meta.key)
            continue
        tag = dict(meta.tags).get(value) if meta.tags else None
        parts.append(tag if tag is not None else meta.key.format(value))
    return "-".join(parts)


def flags(obj: Any, reference: Any = None) -> list[str]:
    """The command-line options that select ``obj``'s values where they differ from ``reference``'s (default:
    the class's defaults): ``["--projection", "shared", "--no-block-norm"]``."""
    reference = reference if reference is not None else type(obj)()
    out: list[str] = []
    for field, meta in settings_of(obj):
        value = getattr(obj, field.name)
        if value == getattr(reference, field.name):
            continue
        flag = flag_of(field, meta)
        if isinstance(value, bool):
            out.append(flag if value else meta.negation or "--no-" + flag[2:])
        elif value is not None:
            out += [flag, ",".join(map(value_text, value)) if meta.many else value_text(value)]
    return out


def value_text(value: Any) -> str:
    """A setting's value as a command line writes it (``0.5``, not ``0.5000``; a tuple comma-separated)."""
    if isinstance(value, tuple):
        return ",".join(map(value_text, value))
    return f"{value:g}" if isinstance(value, float) else str(value)


T = TypeVar("T")


def taken_from(cls: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The keyword ``options`` that are settings of ``cls``, removed from ``options``: for an API function whose
    keywords set the fields of several settings objects (``embed(..., rank=8, workers=4)``)."""
    return {f.name: options.pop(f.name) for f, _ in settings_of(cls) if f.name in options}


def with_options(
    cls: type[T], given: T | None, options: dict[str, Any], owner: str = "", default: T | None = None
) -> T:
    """``given`` with the keyword ``options`` an API function was called with set on it: ``discover(base, limit=2)``
    is ``discover(base, Scope(limit=2))``. Without ``given`` the options set the fields of ``default`` (else
    ``cls()``: a function's own defaults, such as ``neighbors``' ten neighbours). With both, one rule everywhere: a
    keyword sets a field the object leaves at the class's default, or repeats the object's value; a keyword that
    differs from a value the object sets is refused, a ``ValueError`` in one line, never dropped. A name that is not
    a setting of ``cls`` is a ``TypeError`` naming ``owner``, as a wrong keyword is."""
    fields = {f.name: f for f, _ in settings_of(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise TypeError(f"{owner or cls.__name__}() got an unexpected keyword argument {unknown[0]!r}")
    if given is None:
        base = default if default is not None else cls()
        return dataclasses.replace(base, **options) if options else base  # type: ignore[type-var]
    blank = cls()
    for name, value in options.items():
        mine = getattr(given, name)
        if mine != getattr(blank, name) and mine != _checked(fields[name], fields[name].metadata[_KEY], value):
            raise ValueError(
                f"{owner or cls.__name__}: {name}={value!r} conflicts with {cls.__name__}({name}={mine!r}) given with "
                "it: give the setting one way"
            )
    return dataclasses.replace(given, **options) if options else given  # type: ignore[type-var]
