"""An agent tool that cites: ``retriever.as_tool()`` returns numbered sources and segments.

With ``response_format="content_and_artifact"`` the model reads numbered sources (title
or file, pages, character range, exact text) and the caller also gets the segment
``Document``s (offsets and scores) in the ``ToolMessage``: source ``[n]`` is
``artifact[n - 1]``. Runs offline: a scripted fake chat model plays the agent and calls
the tool.
"""

from __future__ import annotations

import re

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

from langchain_rse import RSERetriever
from langchain_rse.sample_data import load_sample_documents


def main() -> None:
    retriever = RSERetriever.from_documents(load_sample_documents(), k=2)
    tool = retriever.as_tool(name="search_company_documents")

    # A real agent would be langchain.agents.create_agent(ChatOpenAI(...), tools=[tool]);
    # this fake model asks for the tool once, then answers citing source [1].
    agent = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage(
                    "",
                    tool_calls=[
                        {
                            "name": tool.name,
                            "args": {"query": "remote work from another country"},
                            "id": "call-1",
                        }
                    ],
                ),
                AIMessage("Up to 20 working days a year, approved two weeks ahead [1]."),
            ]
        )
    )
    messages: list = [HumanMessage("How long may I work remotely from abroad?")]
    reply = agent.invoke(messages)
    messages.append(reply)
    for call in reply.tool_calls:
        result: ToolMessage = tool.invoke({**call, "type": "tool_call"})
        messages.append(result)
        print(f"tool {call['name']}({call['args']}) returned {len(result.artifact)} segments:")
        for seg in result.artifact:
            m = seg.metadata
            print(
                f"  {m['source']} chars {m['start_index']}-{m['end_index']} score {m['score']:.2f}"
            )
        print("content the model sees:\n" + result.text[:400])
    answer = agent.invoke(messages).text
    print("\nagent answer:", answer)
    for n in re.findall(r"\[(\d+)\]", answer):  # each [n] back to its exact source range
        m = result.artifact[int(n) - 1].metadata
        print(f"  [{n}] = {m['source']} characters {m['start_index']}-{m['end_index']}")


if __name__ == "__main__":
    main()
