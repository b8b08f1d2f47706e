#!/bin/sh
# Serve the BM25 index in $AGENTGYM_INDEX; build it first when it is missing, from $AGENTGYM_CORPUS
# (a JSONL file of {id, title, text}) or, without one, from the synthetic corpus (seed 0).
# Extra arguments go to `agentgym retrieval serve` (e.g. --max-k 100).
set -eu
index="${AGENTGYM_INDEX:?set AGENTGYM_INDEX to the index folder}"
if [ ! -f "$index/meta.json" ]; then
    corpus="${AGENTGYM_CORPUS:-}"
    if [ -z "$corpus" ]; then
        synthetic="$(dirname "$index")/synthetic"
        agentgym retrieval synthetic "$synthetic" --entities "${AGENTGYM_SYNTHETIC_ENTITIES:-500}"
        corpus="$synthetic/corpus.jsonl"
    fi
    agentgym retrieval index "$corpus" --out "$index"
fi
exec agentgym retrieval serve "$index" --host "${AGENTGYM_HOST:-0.0.0.0}" --port "${AGENTGYM_PORT:-8001}" "$@"
