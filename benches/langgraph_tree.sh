#!/usr/bin/env bash
# The peer baseline: LangGraph running the same tree as weft's tree benchmark.
# Creates a venv under target/bench-venv from PyPI on first use, then prints one JSON object.
#   benches/langgraph_tree.sh WIDTH DEPTH
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv="$here/../target/bench-venv"
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import langgraph.checkpoint.sqlite, langchain_core" 2>/dev/null; then
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q --disable-pip-version-check "langgraph>=0.2" "langgraph-checkpoint-sqlite" "langchain-core" >&2
fi
exec "$venv/bin/python" "$here/langgraph_tree.py" "$@"
