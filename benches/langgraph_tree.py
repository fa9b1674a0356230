"""LangGraph running the tree of weft's tree benchmark, for a side-by-side comparison.

One "thread" = one invocation of a compiled subgraph with its own thread_id, checkpointed by the
SQLite checkpointer (WAL, synchronous=NORMAL: the same durability settings as weft's databases).
An inner thread makes one fake-chat-model call, invokes WIDTH child threads, makes a second call
and answers; a leaf makes one call. The fake model answers at once (zero latency), like weft's
scripted provider. Prints one JSON object.
"""
import json
import resource
import sqlite3
import sys
import tempfile
import time
import uuid
from importlib.metadata import version
from typing import TypedDict

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

WIDTH, DEPTH = int(sys.argv[1]), int(sys.argv[2])


class State(TypedDict):
    level: int
    result: str


def main() -> None:
    tmp = tempfile.mkdtemp(prefix="lg-bench-")
    conn = sqlite3.connect(f"{tmp}/checkpoints.db", check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    saver = SqliteSaver(conn)
    model = FakeListChatModel(responses=["spawning children", "done"])
    count = [0]

    def agent(state: State) -> dict:
        count[0] += 1
        model.invoke([HumanMessage(content="Work.")])
        if state["level"] < DEPTH:
            results = []
            for _ in range(WIDTH):
                out = graph.invoke(
                    {"level": state["level"] + 1, "result": ""},
                    config={"configurable": {"thread_id": str(uuid.uuid4())}},
                )
                results.append(out["result"])
            model.invoke([HumanMessage(content="\n".join(results))])
        return {"result": f"level {state['level']} done"}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    builder.add_edge("agent", END)
    graph = builder.compile(checkpointer=saver)

    t0 = time.perf_counter()
    graph.invoke({"level": 0, "result": ""}, config={"configurable": {"thread_id": str(uuid.uuid4())}})
    wall = time.perf_counter() - t0
    n = count[0]
    print(json.dumps({
        "threads": n,
        "wall_s": wall,
        "threads_per_s": n / wall,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "langgraph_version": version("langgraph"),
    }))


if __name__ == "__main__":
    main()
