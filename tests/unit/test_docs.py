"""The integration page ``docs/retrievers.md``: every code block runs as printed.

Python blocks run in order in one namespace, in a temporary folder, with the OpenAI SDK
pointed (through its own environment variables) at a fake chat-completions server on
127.0.0.1 that plays the model: it calls the search tool when it is offered one, and answers
citing ``[1]`` otherwise. The ``pip install`` block is checked against the installed
package's extras.
"""

from __future__ import annotations

import json
import re
from importlib.metadata import metadata
from pathlib import Path
from typing import Any

import pytest

from fake_openai_server import FakeOpenAIServer, prompt_parts

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "retrievers.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.DOTALL | re.MULTILINE)

pytest.importorskip("langchain_openai")
pytest.importorskip("langchain.agents")


def blocks(language: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(PAGE.read_text()) if lang == language]


def play_the_model(request: dict[str, Any]) -> str | dict[str, Any]:
    """Call the offered tool once with the user's question, then answer citing [1]."""
    messages = request["messages"]
    if request.get("tools") and messages[-1]["role"] == "user":
        name = request["tools"][0]["function"]["name"]
        args = {"query": messages[-1]["content"]}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call-1",
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        }
    return "Up to 20 working days a year, with approval two weeks ahead [1]."


def test_every_python_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = blocks("python")
    assert len(code) >= 6
    monkeypatch.chdir(tmp_path)
    with FakeOpenAIServer(reply=play_the_model) as server:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        namespace: dict[str, Any] = {"__name__": "docs"}
        for n, body in enumerate(code, start=1):
            exec(compile(body, f"{PAGE.name} block {n}", "exec"), namespace)
        requests = server.requests

    # the chain sent the numbered exact sources, the agent's model read the tool's sources
    assert "[1] employee_handbook.md" in "\n".join(prompt_parts(requests[0]))
    shown = [m for r in requests for m in r["messages"] if m["role"] == "tool"]
    assert shown and "[1]" in str(shown[0]["content"]) and "characters" in str(shown[0])
    tool_message = namespace["tool_message"]
    seg = tool_message.artifact[0]
    source = namespace["retriever"].get([seg.metadata["doc_id"]])[0].page_content
    assert seg.page_content == source[seg.metadata["start_index"] : seg.metadata["end_index"]]
    assert "[1]" in namespace["result"]["messages"][-1].text
    assert (tmp_path / "rse-index").is_dir()


def test_the_install_block_names_real_extras() -> None:
    (install,) = blocks("bash")
    extras = set(metadata("langchain-rse").get_all("Provides-Extra") or [])
    named = re.search(r'"langchain-rse\[([^\]]+)\]"', install)
    assert named and set(named.group(1).split(",")) <= extras
