#!/bin/sh
# Serve the BM25 index in $AGENTGYM_INDEX; build it first when it is missing, from $AGENTGYM_CORPUS
# (a JSONL file of {id, title, text}) or, without one, from the synthetic corpus (seed 0).
# Extra arguments go to `agentgym retrieval serve` (e.g. --max-k 100).
set -eu
index="${AGENTGYM_INDEX:?set AGENTGYM_INDEX to the index folder}"
host="${AGENTGYM_HOST:-0.0.0.0}"
# `agentgym retrieval serve` refuses a non-loopback address without a token; say so before the index
# build (minutes for a large corpus), in the same one line.
case "$host" in
    127.*|localhost|::1|\[::1\]) ;;
    *) case "$(printf %s "${AGENTGYM_ALLOW_NO_TOKEN:-}" | tr '[:upper:]' '[:lower:]')" in
           1|true|t|yes|y|on) ;;
           *) if [ -z "${AGENTGYM_RETRIEVAL_TOKEN:-}" ]; then
                  echo "error: ConfigError: --host $host without --token would let anyone who can reach this port query this index; set AGENTGYM_RETRIEVAL_TOKEN to the bearer token clients must send, or set AGENTGYM_ALLOW_NO_TOKEN=1 to accept that" >&2
                  exit 2
              fi ;;
       esac ;;
esac
if [ ! -f "$index/meta.json" ]; then
    corpus="${AGENTGYM_CORPUS:-}"
    if [ -z "$corpus" ]; then
        synthetic="$(dirname "$index")/synthetic"
        agentgym retrieval synthetic "$synthetic" --entities "${AGENTGYM_SYNTHETIC_ENTITIES:-500}"
        corpus="$synthetic/corpus.jsonl"
    fi
    agentgym retrieval index "$corpus" --out "$index"
fi
exec agentgym retrieval serve "$index" --host "$host" --port "${AGENTGYM_PORT:-8001}" "$@"
