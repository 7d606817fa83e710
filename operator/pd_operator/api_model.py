"""The pydantic base every API type derives from: camelCase on the wire, unknown fields refused.

Below every subpackage: the KV model (kv/model.py), the serving-image table and the API all derive from it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    def to_wire(self) -> dict:
        """The manifest form: camelCase keys, unset optional fields left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


# Class name -> CEL rules (`x-kubernetes-validations`), attached by the CRD generator to the
# schema of that class. Kept beside the model so a rule and its pydantic twin are read together.
CEL_RULES: dict[str, list[dict[str, str]]] = {}


def cel(rule: str, message: str):
    """Declare a CEL validation rule the API server evaluates on this object."""

    def attach(cls: type) -> type:
        CEL_RULES.setdefault(cls.__name__, []).insert(0, {"rule": rule, "message": message})
        return cls

    return attach


def preserve_unknown() -> dict:
    """Schema extra for free-form objects (affinity, tolerations, inline config.json)."""
    return {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def sentence(text: str) -> str:
    """A pydantic error message as a sentence of a finding."""
    text = text.removeprefix("Value error, ")
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def field_path(loc: tuple) -> str:
    """A pydantic error location as a manifest field path (`spec.decode.env[0].name`)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "tagged-union") or "[" in str(part):
            continue  # pydantic's own markers inside unions and validators, not fields
        else:
            out += f".{part}" if out else str(part)
    return out
