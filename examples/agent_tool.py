"""An agent tool: the retriever behind ``create_retriever_tool``, segments as artifacts.

With ``response_format="content_and_artifact"`` the model sees the segment text and the
caller also gets the segment ``Document``s (offsets and scores) in the ``ToolMessage``.
Runs offline: a scripted fake chat model plays the agent and calls the tool.
"""

from __future__ import annotations

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import create_retriever_tool

from langchain_rse import RSERetriever
from langchain_rse.sample_data import load_sample_documents


def main() -> None:
    retriever = RSERetriever.from_documents(load_sample_documents(), k=2)
    tool = create_retriever_tool(
        retriever,
        "search_company_documents",
        "Search contracts, policies and incident reports. Returns exact passages.",
        response_format="content_and_artifact",
    )

    # A real agent would be e.g. ChatOpenAI(...).bind_tools([tool]); this fake one
    # asks for the tool once, then answers.
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
                AIMessage("Up to 20 working days a year, approved two weeks ahead."),
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
        print("content the model sees:\n" + result.content[:400])
    print("\nagent answer:", agent.invoke(messages).content)


if __name__ == "__main__":
    main()
