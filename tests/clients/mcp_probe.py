"""An MCP client that nobody on the mop team wrote (the official Python SDK), driving
`mop mcp` inside a real `mop run` sandbox. Called by tests/mcp.rs with one JSON argument:

  {"query": ..., "hidden_query": ..., "hidden_id": ..., "store_title": ...}

It prints one JSON object with what each call returned; the Rust test asserts on it.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp import MCPError


def text_of(result):
    return "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")


def tool_result(r):
    return {
        "is_error": bool(r.is_error),
        "text": text_of(r),
        "structured": r.structured_content,
    }


async def main(args):
    server = StdioServerParameters(command="/run/mop/bin/mop", args=["mcp"])
    out = {}
    async with stdio_client(server) as (read, write):
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            out["protocol_version"] = str(init.protocol_version)
            out["server_name"] = init.server_info.name
            out["instructions"] = init.instructions or ""
            tools = await session.list_tools()
            out["tools"] = {t.name: t.input_schema for t in tools.tools}

            out["retrieve"] = tool_result(
                await session.call_tool("memory_retrieve", {"query": args["query"]})
            )
            out["retrieve_hidden"] = tool_result(
                await session.call_tool("memory_retrieve", {"query": args["hidden_query"]})
            )
            first = out["retrieve"]["structured"]["hits"][0]["id"]
            out["get"] = tool_result(await session.call_tool("memory_get", {"id": first}))
            out["get_hidden"] = tool_result(
                await session.call_tool("memory_get", {"id": args["hidden_id"]})
            )
            out["list"] = tool_result(await session.call_tool("memory_list", {}))
            out["feedback"] = tool_result(
                await session.call_tool(
                    "memory_feedback", {"id": first, "verdict": "helped", "note": "it held"}
                )
            )
            out["feedback_hidden"] = tool_result(
                await session.call_tool(
                    "memory_feedback", {"id": args["hidden_id"], "verdict": "wrong"}
                )
            )
            out["store"] = tool_result(
                await session.call_tool(
                    "memory_store",
                    {
                        "type": "pitfall",
                        "title": args["store_title"],
                        "description": "Stored through MCP by the Python SDK",
                        "content": "The nightly export needs undo retention above 4 hours.",
                        "error_codes": ["ORA-01555"],
                    },
                )
            )

            resources = await session.list_resources()
            out["resources"] = [str(r.uri) for r in resources.resources]
            index = await session.read_resource("mop://memory/MEMORY.md")
            out["memory_md"] = "".join(getattr(c, "text", "") for c in index.contents)
            card_uri = next(u for u in out["resources"] if not u.endswith("/MEMORY.md"))
            card = await session.read_resource(card_uri)
            out["card_resource"] = "".join(getattr(c, "text", "") for c in card.contents)

            # Malformed calls: each must be a clean MCP error, and the session must live on.
            errors = {}
            for name, call in {
                "wrong_type": ("memory_retrieve", {"query": 5}),
                "missing_field": ("memory_store", {"type": "pitfall"}),
                "unknown_field": ("memory_list", {"everything": True}),
                "bad_enum": (
                    "memory_store",
                    {"type": "gossip", "title": "t", "content": "c"},
                ),
                "not_an_id": ("memory_get", {"id": "../../etc/passwd"}),
                "unknown_tool": ("memory_delete", {}),
            }.items():
                try:
                    r = await session.call_tool(*call)
                    errors[name] = {"is_error": bool(r.is_error), "message": text_of(r)}
                except MCPError as e:
                    errors[name] = {"code": e.code, "message": e.message}
            try:
                await session.read_resource("mop://memory/../../../etc/passwd")
                errors["bad_resource"] = {"message": "read succeeded"}
            except MCPError as e:
                errors["bad_resource"] = {"code": e.code, "message": e.message}
            out["errors"] = errors
            out["alive_after_errors"] = len((await session.list_tools()).tools)
    print(json.dumps(out))


asyncio.run(main(json.loads(sys.argv[1])))
