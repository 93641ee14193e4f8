"""Loaders for the external evaluation data kept outside the repository (../shared/eval).

The directory is ``<repo>/../shared/eval`` unless the environment variable ``MEMCI_EVAL_DIR`` names
another. Every loader returns ``None`` when its files are absent, so callers can skip cleanly.

* MADial-Bench (English): 160 dialogues, each with the turn(s) at which the assistant should bring up a
  memory (``test-turn``, an index into the raw dialogue lines) and the ids of the relevant memories;
  160 memories, stored as one block per user with ascending ids (the block boundaries are where the id
  sequence restarts, which is how the benchmark's own code splits them: 76 for user 1, 84 for user 2).
* MemoryBank (English): per-user dated chat histories and unlabelled probing questions.
* LongMemEval (English, the dev half of the oracle set): 252 questions in the user's own words, each with its
  dated evidence sessions, whose answering turns are flagged ``has_answer``. ``longmemeval_history`` surrounds a
  question's evidence sessions with other questions' sessions to make a long history.
* LongMemEval S (the same dev half, 251 questions, ``longmemeval_s_dev.json.gz``): each question's own haystack,
  about 48 dated sessions, the evidence sessions among them (``load_longmemeval_s``).
"""

from __future__ import annotations

import gzip
import json
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "eval_dir",
    "Turn",
    "MadialMemory",
    "MadialDialogue",
    "MadialBench",
    "load_madial_bench",
    "MemoryBankExchange",
    "MemoryBankUser",
    "load_memorybank",
    "LongMemEvalSession",
    "LongMemEvalQuestion",
    "LongMemEvalHistory",
    "load_longmemeval",
    "longmemeval_history",
    "LongMemEvalHaystack",
    "load_longmemeval_s",
]

_TURN_LINE = re.compile(r'^\s*<([^>]{1,40})>:\s*(.*?)\s*$', re.DOTALL)


def eval_dir() -> Path | None:
    """The evaluation data directory, or None when it does not exist."""
    override = os.environ.get("MEMCI_EVAL_DIR")
    path = Path(override) if override else Path(__file__).resolve().parents[2].parent / "shared" / "eval"
    return path if path.is_dir() else None


def _read_jsonl(path: Path) -> list[dict]:
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


# -- MADial-Bench ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Turn:
    speaker: str | None  # None for a line without a "<Name>:" prefix
    text: str


@dataclass(frozen=True, slots=True)
class MadialMemory:
    id: int
    user_id: int
    time: str
    scene: str
    emotion: str
    event: str


@dataclass(frozen=True, slots=True)
class MadialDialogue:
    index: int
    user_id: int
    lines: tuple[str, ...]  # raw lines, "<BOD>" first and "<EOD>" last
    test_turns: tuple[int, ...]
    relevant_ids: tuple[int, ...]

    def turns_before(self, line_index: int) -> list[Turn]:
        """The parsed turns before raw line ``line_index`` (markers skipped)."""
        return [parse_turn(line) for line in self.lines[:line_index] if line.strip() not in ("<BOD>", "<EOD>")]


@dataclass(frozen=True, slots=True)
class MadialBench:
    dialogues: list[MadialDialogue]
    memories: list[MadialMemory]

    def memories_of(self, user_id: int) -> list[MadialMemory]:
        return [m for m in self.memories if m.user_id == user_id]


def parse_turn(line: str) -> Turn:
    match = _TURN_LINE.match(line)
    if match is None:
        return Turn(None, line.strip().strip("<>").strip('"').strip())
    return Turn(match.group(1).strip(), match.group(2).strip().strip('"').strip())


def load_madial_bench(lang: str = "en") -> MadialBench | None:
    root = eval_dir()
    if root is None:
        return None
    folder = root / "madial-bench"
    dialogue_file = folder / f"MADial-Bench-{lang}-dialogue.jsonl"
    memory_file = folder / f"MADial-Bench-{lang}-memory.jsonl"
    if not (dialogue_file.is_file() and memory_file.is_file()):
        return None
    memories: list[MadialMemory] = []
    user_id, previous_id = 1, None
    for record in _read_jsonl(memory_file):
        ((raw_id, fields),) = record.items()
        memory_id = int(raw_id)
        if previous_id is not None and memory_id < previous_id:
            user_id += 1
        previous_id = memory_id
        memories.append(
            MadialMemory(
                id=memory_id,
                user_id=user_id,
                time=str(fields.get("time", "")),
                scene=str(fields.get("scene", "")),
                emotion=str(fields.get("emotion", "")),
                event=str(fields.get("event", "")),
            )
        )
    dialogues = [
        MadialDialogue(
            index=i,
            user_id=int(record["user-id"]),
            lines=tuple(record["dialogue"]),
            test_turns=tuple(int(t) for t in record["test-turn"]),
            relevant_ids=tuple(int(r) for r in record["relevant-id"]),
        )
        for i, record in enumerate(_read_jsonl(dialogue_file))
    ]
    return MadialBench(dialogues=dialogues, memories=memories)


# -- MemoryBank -----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class MemoryBankExchange:
    date: str
    query: str
    response: str


@dataclass(frozen=True, slots=True)
class MemoryBankUser:
    name: str
    exchanges: list[MemoryBankExchange]
    probing_questions: list[str]


def load_memorybank() -> list[MemoryBankUser] | None:
    root = eval_dir()
    if root is None:
        return None
    folder = root / "memorybank"
    bank_file, questions_file = folder / "memory_bank_en.json", folder / "probing_questions_en.jsonl"
    if not (bank_file.is_file() and questions_file.is_file()):
        return None
    bank = json.loads(bank_file.read_text(encoding="utf-8"))
    questions: dict[str, list[str]] = {}
    for record in _read_jsonl(questions_file):
        for name, asked in record.items():
            questions[name.strip()] = [str(q) for q in asked]
    users = []
    for key, user in bank.items():
        name = str(user.get("name", key)).strip()
        exchanges = [
            MemoryBankExchange(date=date, query=str(pair.get("query", "")), response=str(pair.get("response", "")))
            for date, pairs in user.get("history", {}).items()
            for pair in pairs
        ]
        users.append(MemoryBankUser(name=name, exchanges=exchanges, probing_questions=questions.get(name, [])))
    return users


# -- LongMemEval ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LongMemEvalSession:
    id: str
    date: str  # "2023/08/16 (Wed) 03:47"
    messages: tuple[dict, ...]  # {"role", "content"} only (the has_answer flags are in ``evidence``)
    evidence: tuple[int, ...]  # indexes of the messages flagged has_answer


@dataclass(frozen=True, slots=True)
class LongMemEvalQuestion:
    id: str
    kind: str  # question_type: temporal-reasoning, multi-session, knowledge-update, single-session-*
    question: str
    answer: str
    date: str
    sessions: tuple[LongMemEvalSession, ...]  # the evidence sessions, oldest first


@dataclass(frozen=True, slots=True)
class LongMemEvalHistory:
    question: LongMemEvalQuestion
    sessions: tuple[LongMemEvalSession, ...]  # oldest first: the evidence sessions among fillers
    evidence_sessions: tuple[int, ...]  # positions in ``sessions`` of the question's own sessions

    def messages(self) -> list[dict]:
        return [dict(m) for s in self.sessions for m in s.messages]

    def evidence_messages(self) -> list[int]:
        """Indexes into ``messages()`` of the turns flagged has_answer."""
        out, offset = [], 0
        for position, session in enumerate(self.sessions):
            if position in self.evidence_sessions:
                out.extend(offset + i for i in session.evidence)
            offset += len(session.messages)
        return out


def load_longmemeval() -> list[LongMemEvalQuestion] | None:
    root = eval_dir()
    path = root / "longmemeval" / "longmemeval_oracle_dev.json" if root is not None else None
    if path is None or not path.is_file():
        return None
    questions = []
    for record in json.loads(path.read_text(encoding="utf-8")):
        sessions = []
        for sid, date, raw in zip(record["haystack_session_ids"], record["haystack_dates"],
                                  record["haystack_sessions"]):
            messages = tuple({"role": m["role"], "content": m["content"]} for m in raw)
            evidence = tuple(i for i, m in enumerate(raw) if m.get("has_answer"))
            sessions.append(LongMemEvalSession(str(sid), str(date), messages, evidence))
        questions.append(LongMemEvalQuestion(
            str(record["question_id"]), str(record["question_type"]), str(record["question"]), str(record["answer"]),
            str(record["question_date"]), tuple(sessions)))
    return questions


def longmemeval_history(questions: list[LongMemEvalQuestion], index: int, target_messages: int = 500,
                        seed: int = 0) -> LongMemEvalHistory:
    """Question ``index``'s evidence sessions among other questions' sessions (chosen by a generator seeded with
    ``seed`` and ``index``) until the history holds about ``target_messages`` messages, all in the order of their
    dates. Each session starts with a user message, so pages never straddle two sessions."""
    rng = random.Random(f"{seed}:{index}")
    own = questions[index]
    own_ids = {s.id for s in own.sessions}
    pool = [s for i, q in enumerate(questions) if i != index for s in q.sessions
            if s.id not in own_ids and s.messages and s.messages[0]["role"] == "user"]
    rng.shuffle(pool)
    fillers, size, seen = [], sum(len(s.messages) for s in own.sessions), set()
    for session in pool:
        if size >= target_messages:
            break
        if session.id in seen:
            continue
        seen.add(session.id)
        fillers.append(session)
        size += len(session.messages)
    sessions = sorted([*fillers, *own.sessions], key=lambda s: _session_time(s.date))
    evidence_positions = tuple(i for i, s in enumerate(sessions) if s.id in own_ids)
    return LongMemEvalHistory(own, tuple(sessions), evidence_positions)


def _session_time(date: str) -> str:
    """"2023/08/16 (Wed) 03:47" -> "2023/08/16 03:47" (sorts in time order)."""
    return f"{date[:10]} {date[-5:]}"


@dataclass(frozen=True, slots=True)
class LongMemEvalHaystack:
    """A question with LongMemEval's S haystack: about 48 sessions of one user, on their dates, oldest first."""

    question: LongMemEvalQuestion  # ``question.sessions``: the evidence sessions alone
    sessions: tuple[LongMemEvalSession, ...]

    def evidence(self) -> list[str]:
        """The texts of the evidence sessions' messages flagged has_answer."""
        return [s.messages[i]["content"] for s in self.question.sessions for i in s.evidence]


def load_longmemeval_s(path: Path | None = None) -> list[LongMemEvalHaystack] | None:
    """LongMemEval's S haystacks of the dev half (``longmemeval/longmemeval_s_dev.json.gz``: sessions stored once,
    each question naming its own by id with their dates); None when the file is absent."""
    if path is None:
        root = eval_dir()
        path = root / "longmemeval" / "longmemeval_s_dev.json.gz" if root is not None else None
    if path is None or not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    stored = data["sessions"]
    out = []
    for record in data["questions"]:
        sessions = []
        for sid, date in zip(record["haystack_session_ids"], record["haystack_dates"]):
            raw = stored[sid]
            sessions.append(LongMemEvalSession(
                str(sid), str(date), tuple({"role": m["role"], "content": m["content"]} for m in raw),
                tuple(i for i, m in enumerate(raw) if m.get("has_answer"))))
        sessions.sort(key=lambda s: _session_time(s.date))
        answers = set(record["answer_session_ids"])
        question = LongMemEvalQuestion(
            str(record["question_id"]), str(record["question_type"]), str(record["question"]), str(record["answer"]),
            str(record["question_date"]), tuple(s for s in sessions if s.id in answers))
        out.append(LongMemEvalHaystack(question, tuple(sessions)))
    return out
