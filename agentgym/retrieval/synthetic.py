"""The synthetic multi-hop QA set: ``generate_corpus`` (fictional encyclopedia + 1-3 hop questions) and
``write_jsonl``.

Every entity has an invented name built from syllables, so no model can know an answer without
searching. Facts are stated only in the document of their subject (a person's document says where
they were born; the city's document says which country it is in), so a k-hop question needs k
documents, found one after the other.

The retrieval package owns it as its built-in corpus: ``agentgym retrieval synthetic`` writes it out,
and ``search-qa-v0`` uses it when given no dataset.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from agentgym.errors import ConfigError

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "th", "qu", "br", "dr", "kr",
           "st", "sk", "vr", "zh")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "y")
_CODAS = ("", "", "", "n", "r", "l", "s", "x", "th", "m")
_COMPANY_SUFFIXES = ("Labs", "Industries", "Systems", "Dynamics", "Works", "Holdings", "Foundry")
_FIELDS = ("shipbuilding", "glassmaking", "cartography", "robotics", "textiles", "pharmaceuticals", "optics",
           "software", "aerospace", "agriculture")
_JOBS = ("an engineer", "a chemist", "a sculptor", "an economist", "a navigator", "a botanist", "a composer")


@dataclass(frozen=True)
class QAItem:
    """One question with its gold answer and the evidence chain that answers it."""

    id: str
    """Question id (the env's ``task_id``)."""
    question: str
    """The question text."""
    golden_answers: list[str]
    """Accepted answers (Search-R1 field name)."""
    hops: int
    """Documents that must be read, in order, to answer."""
    supporting_docs: list[str]
    """Ids of those documents, in reading order; the last one states the answer."""
    search_queries: list[str]
    """The entity name to search at each hop (what the scripted expert searches)."""


def _word(rng: np.random.Generator, used: set[str], syllables: tuple[int, int]) -> str:
    while True:
        count = int(rng.integers(syllables[0], syllables[1] + 1))
        word = "".join(
            _ONSETS[int(rng.integers(len(_ONSETS)))] + _VOWELS[int(rng.integers(len(_VOWELS)))]
            + _CODAS[int(rng.integers(len(_CODAS)))]
            for _ in range(count)
        )
        if word not in used and len(word) >= 4:
            used.add(word)
            return word.capitalize()


def generate_corpus(num_entities: int = 200, seed: int = 0) -> tuple[list[dict[str, str]], list[QAItem]]:
    """A fictional corpus (one document per entity) and questions over it; same arguments, same output.

    Entities: countries (with a language and a capital), cities (in a country), companies (founded
    by a person, in a year, headquartered in a city) and people (born in a city, in a year, working
    for a company). Every name word is unique across the corpus. Questions (one per person and per
    company, up to ``num_entities``) take 1, 2 or 3 hops, e.g. "In which country was the founder
    of Zorvex Labs born?" (company → founder → birth city → country).

    Args:
        num_entities: entities in the corpus, in ``[20, 2_000_000]``.
        seed: generator seed.

    Returns:
        ``(docs, questions)``: docs as ``{"id", "title", "text"}`` dicts, questions as ``QAItem``.

    Raises:
        ConfigError: ``num_entities`` out of range.

    Example:
        >>> docs, questions = generate_corpus(40, seed=1)
        >>> len(docs), all(q.hops == len(q.supporting_docs) for q in questions)
        (40, True)
    """
    if (isinstance(num_entities, bool) or not isinstance(num_entities, int)
            or not 20 <= num_entities <= 2_000_000):
        raise ConfigError(f"num_entities must be an integer in [20, 2000000], got {num_entities!r}")
    # One generator for the whole set, drawn from in a fixed order (world, then questions): the same
    # arguments give the same corpus, byte for byte.
    rng = np.random.default_rng([seed, num_entities, 0x5EA7C4])
    world = _invent_world(rng, num_entities)
    docs = _describe(world)
    return docs, _ask_questions(rng, world, docs, num_entities)


@dataclass
class _World:
    """The entities of a corpus, each a dict of its facts; facts that name another entity hold its index."""

    countries: list[dict[str, Any]]
    cities: list[dict[str, Any]]
    people: list[dict[str, Any]]
    companies: list[dict[str, Any]]

    def country_of(self, city: int) -> dict[str, Any]:
        return self.countries[self.cities[city]["country"]]


def _invent_world(rng: np.random.Generator, num_entities: int) -> _World:
    """``num_entities`` entities: about 1/40 countries, 1/8 cities, 1/5 companies, the rest people."""
    used: set[str] = set()
    num_countries = max(3, num_entities // 40)
    num_cities = max(6, num_entities // 8)
    num_companies = max(4, num_entities // 5)
    num_people = num_entities - num_countries - num_cities - num_companies

    countries = [{"name": _word(rng, used, (2, 3)), "language": _word(rng, used, (2, 3)) + "ic"}
                 for _ in range(num_countries)]
    cities = [{"name": _word(rng, used, (2, 3)), "country": i % num_countries if i < num_countries
               else int(rng.integers(num_countries)), "founded": int(rng.integers(800, 1800))}
              for i in range(num_cities)]
    for i, country in enumerate(countries):
        country["capital"] = i  # the first num_countries cities are the capitals, one per country
    people = [{"name": f"{_word(rng, used, (2, 2))} {_word(rng, used, (2, 3))}",
               "city": int(rng.integers(num_cities)), "born": int(rng.integers(1900, 2001)),
               "job": _JOBS[int(rng.integers(len(_JOBS)))]} for _ in range(num_people)]
    companies = [{"name": f"{_word(rng, used, (2, 3))} "
                          f"{_COMPANY_SUFFIXES[int(rng.integers(len(_COMPANY_SUFFIXES)))]}",
                  "founder": int(rng.integers(num_people)), "city": int(rng.integers(num_cities)),
                  "year": int(rng.integers(1850, 2021)), "field": _FIELDS[int(rng.integers(len(_FIELDS)))]}
                 for _ in range(num_companies)]
    for number, person in enumerate(people):
        # Nobody works for a company they founded: "who founded the company X works for?" would
        # contain its own answer.
        while True:
            person["employer"] = int(rng.integers(num_companies))
            if companies[person["employer"]]["founder"] != number or num_companies == 1:
                break
    return _World(countries, cities, people, companies)


def _doc_id(kind: str, i: int) -> str:
    return f"{kind}-{i:06d}"


def _describe(world: _World) -> list[dict[str, str]]:
    """One document per entity (countries, cities, companies, people, in that order), each stating
    only the facts of its own subject."""
    countries, cities, people, companies = world.countries, world.cities, world.people, world.companies
    docs: list[dict[str, str]] = []
    for i, c in enumerate(countries):
        capital = cities[c["capital"]]["name"]
        docs.append({"id": _doc_id("country", i), "title": c["name"],
                     "text": f"{c['name']} is a country. Its official language is {c['language']} and its "
                             f"capital is {capital}."})
    for i, city in enumerate(cities):
        docs.append({"id": _doc_id("city", i), "title": city["name"],
                     "text": f"{city['name']} is a city in {countries[city['country']]['name']}. "
                             f"{city['name']} was founded in the year {city['founded']}."})
    for i, co in enumerate(companies):
        docs.append({"id": _doc_id("company", i), "title": co["name"],
                     "text": f"{co['name']} is a {co['field']} company founded in {co['year']} by "
                             f"{people[co['founder']]['name']}. {co['name']} is headquartered in "
                             f"{cities[co['city']]['name']}."})
    for i, p in enumerate(people):
        docs.append({"id": _doc_id("person", i), "title": p["name"],
                     "text": f"{p['name']} is {p['job']} born in {p['born']} in {cities[p['city']]['name']}. "
                             f"{p['name']} works for {companies[p['employer']]['name']}."})
    return docs


#: A question that can be asked: (question, answer, [(doc id, search query) per hop]).
_Option = tuple[str, str, list[tuple[str, str]]]


def _person_questions(world: _World, i: int) -> list[_Option]:
    """The questions about person ``i``: 1 to 3 hops, starting at their document."""
    people, cities = world.people, world.cities
    p = people[i]
    city, co = cities[p["city"]], world.companies[p["employer"]]
    pd, cd = (_doc_id("person", i), p["name"]), (_doc_id("city", p["city"]), city["name"])
    kd = (_doc_id("company", p["employer"]), co["name"])
    country = world.country_of(p["city"])
    return [
        (f"In which city was {p['name']} born?", city["name"], [pd]),
        (f"In which year was {p['name']} born?", str(p["born"]), [pd]),
        (f"In which country was {p['name']} born?", country["name"], [pd, cd]),
        (f"Who founded the company that {p['name']} works for?", people[co["founder"]]["name"], [pd, kd]),
        (f"In which city is the employer of {p['name']} headquartered?", cities[co["city"]]["name"],
         [pd, kd]),
        (f"What is the official language of the country where {p['name']} was born?", country["language"],
         [pd, cd, (_doc_id("country", cities[p["city"]]["country"]), country["name"])]),
        (f"In which country is the employer of {p['name']} headquartered?",
         world.country_of(co["city"])["name"],
         [pd, kd, (_doc_id("city", co["city"]), cities[co["city"]]["name"])]),
    ]


def _company_questions(world: _World, i: int) -> list[_Option]:
    """The questions about company ``i``: 1 to 3 hops, starting at its document."""
    cities = world.cities
    co = world.companies[i]
    founder = world.people[co["founder"]]
    kd, fd = (_doc_id("company", i), co["name"]), (_doc_id("person", co["founder"]), founder["name"])
    hq = (_doc_id("city", co["city"]), cities[co["city"]]["name"])
    birth = (_doc_id("city", founder["city"]), cities[founder["city"]]["name"])
    return [
        (f"Who founded {co['name']}?", founder["name"], [kd]),
        (f"In which year was {co['name']} founded?", str(co["year"]), [kd]),
        (f"In which country is {co['name']} headquartered?", world.country_of(co["city"])["name"], [kd, hq]),
        (f"In which city was the founder of {co['name']} born?", cities[founder["city"]]["name"],
         [kd, fd]),
        (f"In which country was the founder of {co['name']} born?", world.country_of(founder["city"])["name"],
         [kd, fd, birth]),
    ]


def _ask_questions(rng: np.random.Generator, world: _World, docs: list[dict[str, str]],
                   num_entities: int) -> list[QAItem]:
    """One question for each of up to ``num_entities`` companies and people, in a shuffled order."""
    texts = {doc["id"]: f"{doc['title']} {doc['text']}" for doc in docs}
    subjects = ([("company", i) for i in range(len(world.companies))]
                + [("person", i) for i in range(len(world.people))])
    order = rng.permutation(len(subjects))[:num_entities].tolist()
    questions: list[QAItem] = []
    for number, which in enumerate(order):
        kind, i = subjects[which]
        options = _company_questions(world, i) if kind == "company" else _person_questions(world, i)
        # Drop chains whose answer already shows up in an earlier hop's document by coincidence
        # (a person born in the city where their employer sits): those need fewer hops than they claim.
        options = [o for o in options if not any(o[1] in texts[d] for d, _ in o[2][:-1])]
        # 1:2:2 mix of 1-, 2- and 3-hop questions, so most need chaining.
        want = int(rng.choice([1, 2, 2, 3, 3]))
        fitting = [o for o in options if len(o[2]) == want] or options  # 1-hop options always remain
        text, answer, chain = fitting[int(rng.integers(len(fitting)))]
        questions.append(QAItem(
            id=f"synqa-{number:06d}", question=text, golden_answers=[answer], hops=len(chain),
            supporting_docs=[d for d, _ in chain], search_queries=[q for _, q in chain],
        ))
    return questions


def write_jsonl(docs: list[dict[str, str]], questions: list[QAItem],
                out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``corpus.jsonl`` (``{id, title, text}``) and ``questions.jsonl`` (Search-R1 style) to
    ``out_dir``.

    Question lines are ``{"id", "question", "golden_answers", "metadata": {hops, supporting_docs,
    search_queries}}``: the Search-R1 fields plus the evidence chain.

    Returns:
        The paths of the corpus and question files.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus, qa = out / "corpus.jsonl", out / "questions.jsonl"
    with corpus.open("w", encoding="utf-8") as handle:
        for doc in docs:
            handle.write(json.dumps(doc, ensure_ascii=False) + "\n")
    with qa.open("w", encoding="utf-8") as handle:
        for item in questions:
            row = asdict(item)
            line = {key: row.pop(key) for key in ("id", "question", "golden_answers")}
            handle.write(json.dumps({**line, "metadata": row}, ensure_ascii=False) + "\n")
    return corpus, qa
