"""What a chat reply is held to, token by token (``eu_audit.engines.constraint``): the JSON its
``response_format`` asks for, or a forced call's arguments, the function's ``parameters``, as OpenAI's
strict calls and llama.cpp's server hold them. What each reply was held to is logged as ``held_to``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eu_audit.engines.constraint import JsonConstraint, JsonShape, StructuredOutput
from eu_audit.errors import BadInput
from eu_audit.serve.api import ANY_JSON_OBJECT, ResponseFormat


def format_shape(fmt: ResponseFormat | None, tools: Any, log: dict[str, Any]) -> JsonShape | None:
    """The JSON a reply's ``response_format`` asks for. With tools offered the model may call one
    instead (an OpenAI reply's format binds its content, not its calls): not enforced, logged so."""
    wanted = fmt.wanted() if fmt is not None else None
    if wanted is None:
        return None
    name, schema = wanted
    if tools:
        log["held_to"] = f"{name} (not enforced: the request offers tools)"
        return None
    return JsonShape(schema, name)


def call_shape(name: str, tools: list[dict[str, Any]]) -> JsonShape:
    """A forced call's arguments: the function's ``parameters`` schema, then the call's closing brace.
    The client never asked serve to check its schema: keywords the compiler lacks are ignored."""
    i, spec = next(
        (i, t.get("function") or t)
        for i, t in enumerate(tools)
        if (t.get("function") or t).get("name") == name
    )
    params = spec.get("parameters")
    schema = params if isinstance(params, dict) and params else dict(ANY_JSON_OBJECT)
    field = f"tools[{i}].function.parameters"
    return JsonShape(schema, f"arguments of {name}", after="}", field=field, lenient=True)


def hold(
    structured: Callable[[], StructuredOutput], shape: JsonShape | None, log: dict[str, Any]
) -> JsonConstraint | None:
    """The shape compiled for one reply, logged as ``held_to``. A shape the client asked for (its
    ``response_format``) that cannot be enforced is its error (``BadInput``); a lenient one (a tool's
    parameters) is logged and the reply left free."""
    if shape is None:
        return None
    try:
        constraint = structured().constraint(shape)
    except BadInput as exc:
        if not shape.lenient:
            raise
        log["held_to"] = f"{shape.name} (not enforced: {exc})"
        return None
    log["held_to"] = shape.name
    return constraint
