"""The text a chat request is routed on. One definition for the server (`serve/protocol.py`) and
for the importers of call logs (`matrix/import_table.py`), so a router trained on imported
conversations reads the same text it is served."""

from __future__ import annotations

from typing import Any


def content_text(content: Any) -> str:
    """Message content as text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return ""


def routed_text(messages: list[dict]) -> str:
    """The last user message's text (the last message's when no message is the user's)."""
    for m in reversed(messages):
        if m.get("role") == "user":
            return content_text(m.get("content"))
    return content_text(messages[-1].get("content"))
