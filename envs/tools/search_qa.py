"""``SearchQAEnv`` (``search-qa-v0``): Search-R1-style multi-turn QA with a search tool; also the EM/F1
answer scoring.

The agent searches a corpus (``<search>query</search>`` → ``<information>…</information>``) as
often as the turn budget allows, then answers once (``<answer>text</answer>``), which ends the
episode with an exact-match (or F1) reward.
"""

from __future__ import annotations

import functools
import json
import os
import re
import string
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Literal

from agentgym.core import Env, TaskSplit
from agentgym.envs.arguments import check_int, check_non_negative
from agentgym.envs.tools.tool_calls import parse_tool_calls, tool_spec, work_or_answer
from agentgym.errors import ConfigError
from agentgym.retrieval.index import Index, Retriever, read_corpus
from agentgym.retrieval.synthetic import generate_corpus
from agentgym.snapshot import pack_snapshot, unpack_snapshot

#: Most ``search`` calls one turn may make.
MAX_SEARCHES_PER_TURN = 3
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)
_ECHO_CHARS = 200

TOOLS: list[dict[str, Any]] = [
    tool_spec("search", "Search the document collection; returns the top documents for the query.",
              {"query": {"type": "string", "description": "What to look for, e.g. an entity's name."}}),
    tool_spec("answer", "Give the final answer; this ends the episode.",
              {"answer": {"type": "string", "description": "The answer only, a few words at most."}}),
]
_INSTRUCTIONS = (
    "Answer the question. You know nothing about its subject: find the facts by searching a document "
    "collection, one step at a time, then answer.\n"
    "- To search, write <search>your query</search>. The top {top_k} documents come back between "
    "<information> and </information>. Search for names you need to know more about; a question may "
    "need several searches, each building on what the previous one found.\n"
    "- To answer, write <answer>the answer</answer> with the answer only (a name, a place, a year). "
    "This ends the episode; you answer once.\n"
    "- A turn either searches (up to {max_searches} queries) or answers. You may think before the tag.\n"
    "- The JSON form works too: <tool_call>{{\"name\": \"search\", \"arguments\": {{\"query\": \"...\"}}}}"
    "</tool_call> and <tool_call>{{\"name\": \"answer\", \"arguments\": {{\"answer\": \"...\"}}}}"
    "</tool_call>."
)


# --- answer scoring (SQuAD / Search-R1) ----------------------------------------------------------


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lowercase, drop punctuation, drop articles (a, an, the), collapse whitespace.

    Example:
        >>> normalize_answer("  The  Republic of Ostavia! ")
        'republic of ostavia'
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def exact_match(prediction: str, golden_answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer, else 0.0.

    Example:
        >>> exact_match("the Eiffel tower.", ["Eiffel Tower"]), exact_match("Eiffel", ["Eiffel Tower"])
        (1.0, 0.0)
    """
    guess = normalize_answer(prediction)
    return 1.0 if any(guess == normalize_answer(gold) for gold in golden_answers) else 0.0


def f1_score(prediction: str, golden_answers: Sequence[str]) -> float:
    """Best token-level F1 (SQuAD: multiset overlap of normalised tokens) over the gold answers.

    Example:
        >>> round(f1_score("Zorvex Labs Tarnholm", ["Zorvex Labs"]), 4)  # p = 2/3, r = 1
        0.8
    """
    guess = normalize_answer(prediction).split()
    best = 0.0
    for gold in golden_answers:
        truth = normalize_answer(gold).split()
        common = sum((Counter(guess) & Counter(truth)).values())
        if common:
            precision, recall = common / len(guess), common / len(truth)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


# --- datasets and retrievers (cached per process: many envs share one corpus) --------------------


@functools.lru_cache(maxsize=8)
def _synthetic(seed: int, num_entities: int) -> tuple[tuple[dict[str, Any], ...], Index]:
    docs, questions = generate_corpus(num_entities, seed)
    items = tuple({"id": q.id, "question": q.question, "golden_answers": list(q.golden_answers),
                   "search_queries": list(q.search_queries), "supporting_docs": list(q.supporting_docs)}
                  for q in questions)
    return items, Index(docs)


@functools.lru_cache(maxsize=8)
def load_dataset(path: str) -> tuple[dict[str, Any], ...]:
    """Questions of a Search-R1 JSONL file: ``{"id", "question", "golden_answers": [...]}`` per line.

    ``golden_answers`` may be a string; ``answers``/``answer`` are accepted for it. A missing ``id``
    becomes ``"<file stem>-<line number>"``. ``metadata.search_queries`` (as ``write_jsonl`` writes
    it) gives the expert its searches.

    Raises:
        ConfigError: the file is missing or a line is malformed (the message names the line).
    """
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"dataset {path!r} does not exist; give a Search-R1 JSONL file or dataset=None")
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ConfigError(f"{path}:{number}: not valid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{number}: each line must be a JSON object")
        answers = next((row[k] for k in ("golden_answers", "answers", "answer") if k in row), None)
        answers = [answers] if isinstance(answers, str) else answers
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ConfigError(f"{path}:{number}: 'question' must be a non-empty string")
        if not isinstance(answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise ConfigError(f"{path}:{number}: 'golden_answers' must be a non-empty list of strings")
        qid = str(row.get("id", f"{file.stem}-{number}"))
        if qid in seen:
            raise ConfigError(f"{path}:{number}: duplicate id {qid!r}")
        seen.add(qid)
        meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        queries = meta.get("search_queries")
        items.append({"id": qid, "question": question.strip(), "golden_answers": answers,
                      "search_queries": queries if isinstance(queries, list) else None,
                      "supporting_docs": meta.get("supporting_docs") if isinstance(queries, list) else None})
    if not items:
        raise ConfigError(f"dataset {path!r} has no questions")
    return tuple(items)


@functools.lru_cache(maxsize=8)
def _corpus_index(corpus: str) -> Index:
    return Index.load(corpus) if Path(corpus).is_dir() else Index(read_corpus(corpus))


class SearchQAEnv(Env):
    """Search-R1-style question answering with a search tool.

    Reset poses a question (chosen by the seed, or ``options={"task_id": <question id>}``). Each
    turn the agent either searches (``<search>query</search>``, up to 3 per turn; the observation is
    ``<information>Doc 1(Title: …) …</information>`` with the top ``top_k`` documents per query) or
    answers (``<answer>text</answer>``), which terminates the episode. Reward: exact match after
    SQuAD normalisation (``reward="em"``, 1.0 or 0.0) or token F1 (``reward="f1"``); the answering
    step reports both as ``info["em"]``/``info["f1"]``, and ``success`` is the exact match. The
    ``<tool_call>{"name": "search"|"answer", "arguments": {...}}</tool_call>`` form is accepted too.
    Anything else is an invalid action (``info["invalid_action"]``, reward ``-format_penalty``) whose
    observation says what was wrong. ``info["tool_calls"]`` is the number of searches the step ran
    (0 on answering and invalid steps).

    ``info["answer"]`` holds the gold answers (privileged: never in an observation or the
    instructions) and ``info["tools"]`` the ``search``/``answer`` specs (on reset, with
    ``instructions``). The expert searches the entity of each hop in turn (it needs the evidence
    chain, which the synthetic set and ``write_jsonl`` files carry) and then answers.

    Args:
        dataset: a Search-R1 JSONL file, or ``None`` for the synthetic multi-hop set.
        corpus: a corpus JSONL file or an index directory to search in-process (required with a
            ``dataset`` and ``retriever="bm25"``; the synthetic set brings its own).
        retriever: ``"bm25"`` (in-process) or the URL of a retrieval service
            (``agentgym.retrieval.service``).
        top_k: documents per search, in ``[1, 20]``.
        corpus_seed: seed of the synthetic set.
        num_entities: size of the synthetic corpus (documents).
        reward: ``"em"`` or ``"f1"``.
        format_penalty: subtracted from the reward of an invalid action (``>= 0``).
        max_doc_chars: documents are cut to this many characters in observations.
        retriever_token: bearer token of the retrieval service (``None``: ``$AGENTGYM_RETRIEVAL_TOKEN``
            if set).
        max_hops: keep only the questions whose evidence chain takes at most this many searches
            (``None``: all; questions without a chain are dropped when it is set).

    Raises:
        ConfigError: an argument is out of range or a file cannot be read.

    Example:
        >>> env = SearchQAEnv(num_entities=40)
        >>> obs, info = env.reset(seed=0)
        >>> obs.startswith("Question: ")
        True
        >>> obs, reward, terminated, _, info = env.step(env.expert_action())
        >>> obs.startswith("<information>"), terminated
        (True, False)
    """

    has_expert: ClassVar[bool] = True
    supports_snapshot: ClassVar[bool] = True

    def __init__(self, dataset: str | None = None, corpus: str | None = None, retriever: str = "bm25",
                 top_k: int = 3, corpus_seed: int = 0, num_entities: int = 500,
                 reward: Literal["em", "f1"] = "em", format_penalty: float = 0.0, max_doc_chars: int = 1000,
                 retriever_token: str | None = None, max_hops: int | None = None) -> None:
        check_int(top_k, "top_k", 1, 20)
        check_int(max_doc_chars, "max_doc_chars", 20, 100_000)
        if reward not in ("em", "f1"):
            raise ConfigError(f"reward must be 'em' or 'f1', got {reward!r}")
        check_non_negative(format_penalty, "format_penalty")
        if not isinstance(retriever, str) or not (retriever == "bm25" or retriever.startswith(("http://", "https://"))):
            raise ConfigError("retriever must be 'bm25' or a retrieval service URL (http://...), "
                              f"got {retriever!r}")
        self.dataset = None if dataset is None else str(dataset)
        self._split_name = "synthetic" if dataset is None else Path(str(dataset)).name.split(".")[0]
        if dataset is None:
            self.items, index = _synthetic(int(corpus_seed), int(num_entities))
        else:
            self.items = load_dataset(str(dataset))
            index = None
        self.retriever: Retriever
        if retriever != "bm25":
            from agentgym.retrieval.client import RetrievalClient

            token = (retriever_token if retriever_token is not None
                     else os.environ.get("AGENTGYM_RETRIEVAL_TOKEN") or None)
            self.retriever = RetrievalClient(retriever, token=token)
        elif corpus is not None:
            self.retriever = _corpus_index(str(corpus))
        elif index is not None:
            self.retriever = index
        else:
            raise ConfigError("a dataset needs corpus= (a corpus JSONL file or index directory) or "
                              "retriever=<retrieval service URL>")
        if max_hops is not None:
            check_int(max_hops, "max_hops", 1, 100)
            self.items = tuple(item for item in self.items
                               if 0 < len(item["search_queries"] or ()) <= max_hops)
            if not self.items:
                raise ConfigError(f"no question needs at most max_hops={max_hops} searches; max_hops needs "
                                  "questions with an evidence chain (the synthetic set or write_jsonl files)")
        self.by_id = {item["id"]: n for n, item in enumerate(self.items)}
        self.top_k, self.reward_kind = int(top_k), reward
        self.format_penalty, self.max_doc_chars = float(format_penalty), int(max_doc_chars)
        self.instructions = _INSTRUCTIONS.format(top_k=self.top_k, max_searches=MAX_SEARCHES_PER_TURN)
        self._item: dict[str, Any] | None = None
        self._retrieved: set[str] = set()
        self._over = False

    def task_splits(self) -> tuple[TaskSplit, ...]:
        """One split of named tasks, the questions in file order: ``synthetic`` for the generated set,
        else the dataset file's name without its extension (``nq_test.jsonl`` gives ``nq_test``)."""
        source = "the synthetic fictional set" if self.dataset is None else self.dataset
        return (TaskSplit(self._split_name, len(self.items), f"questions of {source}, in order"),)

    def describe_task(self, split: TaskSplit, index: int) -> dict[str, Any]:
        """The question's id and text."""
        item = self.items[index]
        return {"task_id": item["id"], "description": " ".join(str(item["question"]).split())}

    def parse_task_id(self, task_id: Any) -> dict[str, Any]:
        """The question item whose id is ``task_id``."""
        if task_id not in self.by_id:
            raise ConfigError(f"unknown search-qa task_id {task_id!r}; "
                              f"ids look like {self.items[0]['id']!r}")
        return self.items[self.by_id[task_id]]

    def choose_task(self, seed: int | None) -> dict[str, Any]:
        """A question item drawn from the seeded ``np_random``."""
        return self.items[int(self.np_random.integers(len(self.items)))]

    def start_task(self, task: dict[str, Any], options: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        self._item = task
        self._retrieved, self._over = set(), False
        info = self._info(invalid=False, success=False)
        info["instructions"] = self.instructions
        info["tools"] = TOOLS
        return self._question(), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        item = self._current()
        parsed = parse_tool_calls(action, TOOLS)
        searches, guess, problem = work_or_answer(parsed, "search", "query", MAX_SEARCHES_PER_TURN,
                                                  work_verb="searches", work_noun="searches")
        if problem is not None:
            hint = "" if parsed.no_call else (
                " Search with <search>query</search> or answer with <answer>text</answer>.")
            obs = f"Invalid action: {problem}.{hint}\n{self._question()}"
            return obs, -self.format_penalty, False, False, self._info(invalid=True, success=False)
        if guess is not None:
            em, f1 = exact_match(guess, item["golden_answers"]), f1_score(guess, item["golden_answers"])
            self._over = True
            shown = " ".join(guess.split())
            shown = shown if len(shown) <= _ECHO_CHARS else shown[:_ECHO_CHARS] + "..."
            verdict = "correct" if em == 1.0 else "not correct"
            info = self._info(invalid=False, success=em == 1.0)
            info.update(em=em, f1=f1)
            return (f"Your answer: {shown}. It is {verdict}.", em if self.reward_kind == "em" else f1,
                    True, False, info)
        results = self.retriever.search(searches, self.top_k)
        blocks = []
        for hits in results:
            self._retrieved.update(hit.id for hit in hits)
            lines = [f"Doc {rank}(Title: {hit.title}) {self._cut(hit.text)}"
                     for rank, hit in enumerate(hits, 1)]
            blocks.append("<information>" + ("\n".join(lines) or "No documents found.") + "</information>")
        info = self._info(invalid=False, success=False, tool_calls=len(searches))
        return "\n".join(blocks), 0.0, False, False, info

    def expert_action(self) -> str | None:
        """Search the next hop's entity whose document is not yet retrieved; then answer the gold answer.

        ``None`` for questions without an evidence chain (plain Search-R1 files) and after the answer.
        """
        item = self._current()
        if self._over or not item.get("search_queries"):
            return None
        # strict=False: a file may give search_queries without supporting_docs (None: no hop to check);
        # the expert then answers at once, as it always has.
        for doc_id, query in zip(item["supporting_docs"] or [], item["search_queries"], strict=False):
            if doc_id not in self._retrieved:
                return f"<search>{query}</search>"
        return f"<answer>{item['golden_answers'][0]}</answer>"

    def snapshot(self) -> bytes:
        """Question id, retrieved doc ids and ``np_random`` as pickled bytes."""
        item = self._current()
        return pack_snapshot(self, {"task_id": item["id"], "retrieved": sorted(self._retrieved),
                                    "over": self._over})

    def restore(self, data: bytes) -> None:
        """Reinstate a ``snapshot`` (trusted bytes only: pickle)."""
        state = unpack_snapshot(self, data)
        self._item = self.items[self.by_id[state["task_id"]]]
        self._retrieved, self._over = set(state["retrieved"]), bool(state["over"])

    def render(self) -> str | None:
        return self._question() if self._item is not None else None

    def close(self) -> None:
        close = getattr(self.retriever, "close", None)
        if callable(close):
            close()

    # --- helpers ---------------------------------------------------------------------------------

    def _current(self) -> dict[str, Any]:
        # The guard (agentgym.make) refuses step/expert/snapshot before reset and steps after the end.
        assert self._item is not None, "reset() first"
        return self._item

    def _question(self) -> str:
        assert self._item is not None
        return f"Question: {self._item['question']}"

    def _cut(self, text: str) -> str:
        return text if len(text) <= self.max_doc_chars else text[: self.max_doc_chars] + "..."

    def _info(self, *, invalid: bool, success: bool, tool_calls: int = 0) -> dict[str, Any]:
        assert self._item is not None
        return {
            # The evidence retrieved so far is the agent's information state: two trajectories that
            # surfaced the same documents (whatever the query wording or order) know the same facts
            # and face the same decision, so GiGPO may compare their actions. Queries and turn
            # counts are history, not state, and stay out.
            "state_key": f"{self._item['id']}|docs={','.join(sorted(self._retrieved))}",
            "task_id": self._item["id"],
            "invalid_action": invalid,
            "success": success,
            "answer": list(self._item["golden_answers"]),
            "tool_calls": tool_calls,
        }

