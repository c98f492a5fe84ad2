"""The campaign config as its users read it: the JSON schema (``rftflow config schema``, for an
editor that validates campaign YAML) and the reference page generated from it
(``rftflow config reference`` → ``docs/reference/configuration.md``), every key with its type,
default, allowed values and description, never written by hand."""

from __future__ import annotations

import json
from typing import Any

from rftflow.components.config import CampaignConfig
from rftflow.flows.orchestration import OrchestrationConfig

INTRO = """# Configuration reference

Every key of a campaign config, generated from its schema (`rftflow config reference`; the tests
fail when this page and the schema differ). Set a key in the campaign's YAML file, or on the
command line with `--set section.key=value` (the value parsed as YAML). Unknown keys and bad
values fail before any work, in one line naming the key. `rftflow config schema` prints the JSON
schema, for editors that validate YAML (`# yaml-language-server: $schema=rftflow-config.json`).
"""


SECTIONS_ELSEWHERE = {"orchestration": OrchestrationConfig}  # sections a layer above components defines


def config_schema() -> dict[str, Any]:
    """The JSON schema of a campaign config (pydantic's), the orchestrator's section included."""
    schema = CampaignConfig.model_json_schema()
    schema["title"] = "rftflow campaign config"
    for name, model in SECTIONS_ELSEWHERE.items():
        section = model.model_json_schema()
        schema["$defs"][model.__name__] = {k: v for k, v in section.items() if k != "$defs"}
        schema["properties"][name] = {"$ref": f"#/$defs/{model.__name__}", "description":
                                      schema["properties"][name].get("description", "")}
    return schema


def _type(prop: dict[str, Any], defs: dict[str, Any]) -> str:
    """A property's type in words: ``int``, ``float or null``, one of the allowed values, …"""
    if "$ref" in prop:
        return defs[prop["$ref"].rsplit("/", 1)[1]].get("title", "section")
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if "const" in prop:
        return f"`{prop['const']}`"
    if "anyOf" in prop:
        return " or ".join(_type(p, defs) for p in prop["anyOf"])
    kind = prop.get("type", "any")
    if kind == "array":
        return f"list of {_type(prop.get('items', {}), defs)}"
    if kind == "object":
        return "mapping"
    return {"integer": "int", "number": "float", "boolean": "bool", "string": "str", "null": "null"}.get(kind, kind)


def _default(field) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if hasattr(value, "model_dump"):
        return "(section)"
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def config_reference() -> str:
    """The configuration reference page, in markdown."""
    schema = config_schema()
    defs = schema.get("$defs", {})
    top = [(name, field) for name, field in CampaignConfig.model_fields.items()
           if not _section(name, field)]
    sections = [(name, field) for name, field in CampaignConfig.model_fields.items() if _section(name, field)]
    out = [INTRO, "## Top level\n", "| key | type | default | description |", "| --- | --- | --- | --- |"]
    for name, field in top:
        out.append(f"| `{name}` | {_type(schema['properties'][name], defs)} | {_default(field)} | "
                   f"{_cell(field.description or '')} |")
    for section, field in sections:
        model = _section(section, field)
        props = defs[model.__name__]["properties"]
        out += ["", f"## `{section}`\n"]
        if model.__doc__ and model.__doc__.strip() and not model.__doc__.startswith(model.__name__):
            out += [" ".join(model.__doc__.split()), ""]
        out += ["| key | type | default | description |", "| --- | --- | --- | --- |"]
        for name, sub in model.model_fields.items():
            out.append(f"| `{section}.{name}` | {_type(props[name], defs)} | {_default(sub)} | "
                       f"{_cell(sub.description or '')} |")
    return "\n".join(out) + "\n"


def _section(name: str, field) -> type | None:
    """The model of section ``name`` (None for a top-level key)."""
    if name in SECTIONS_ELSEWHERE:
        return SECTIONS_ELSEWHERE[name]
    default = field.get_default(call_default_factory=True)
    return type(default) if hasattr(default, "model_dump") else None


def undocumented_keys() -> list[str]:
    """Config keys without a description (the reference would show them blank)."""
    missing = [name for name, f in CampaignConfig.model_fields.items() if not f.description and not _section(name, f)]
    for section, field in CampaignConfig.model_fields.items():
        model = _section(section, field)
        if model is not None:
            missing += [f"{section}.{n}" for n, f in model.model_fields.items() if not f.description]
    return missing
