"""Intent rewrite, rules level (DESIGN 7; seed 004's regex fallback). Pure: no I/O, no clock, deterministic.

``rewrite_rules(history, last_user)`` turns the latest user message into a standalone query by resolving
pronouns and ellipsis against the salient entities of the recent messages (the last 12):

* Entities: English noun phrases (maximal runs of content words, i.e. not function words, common verbs in
  any inflection, feeling adjectives or adverbs; capitalised spans may include "of"/"the"/"and"; "the"
  before a phrase is kept; a phrase whose head is an attribute noun such as "effects" or "types" is not an
  entity), and CJK noun runs (CJK text split at function words). A mention scores ``weight x 0.75^age``
  (user 1, assistant 0.3; longer, capitalised, "tell me about X" / "what is X" and first Chinese phrases a
  little more). Earlier user messages are resolved first, so a pronoun that referred to an entity counts
  as a mention of it. A second, slower score (0.9^age, first message x2) tracks the conversation's topic.
* Pronouns, only in questions and requests (narration is left alone): it / its / they / them / their, and
  this / that / these / those as the subject of a verb ("How does that work?"); 它 / 它们 / 他们 / 她们 /
  这个 / 那个 / 这 / 那 before a verb or at the end. Each takes the most salient entity not named in the
  message ("it" never a person; "they" only a plural one), unless an antecedent precedes it in the same or
  previous sentence ("What is X and why is it important?"); "its"/"their" -> "X's"; an entity replaces
  only its first pronoun.
* Ellipsis: "what about X" / "how about X" / "and X?" / "那X呢" / "X呢" -> the previous user question with
  its matching entity replaced by X (same head word; else a capitalised one for a capitalised X; for
  Chinese its first noun run); unchanged when nothing matches. "what else" / "其他的呢" / "还有呢" ->
  the message followed by the previous question in parentheses.
* Bare questions about an attribute naming nothing ("Are there any benefits?") get the topic appended
  ("... of binge drinking?", "... in Ann Arbor?").

The client's words are never replaced in the prompt: the result goes into the B2b block through
``intent_block``, whose form is fixed: ``"Standalone intent: <query on one line>"``.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .memo import memoised

# What each memo of a text's entities and words may hold (keys and values): texts are whole messages.
ENTITY_MEMO_BYTES = 16 * 1024 * 1024

__all__ = [
    "LEVEL_MODEL",
    "LEVEL_RULES",
    "LEVEL_PASSTHROUGH",
    "INTENT_PREFIX",
    "RewriteResult",
    "intent_block",
    "message_text",
    "rewrite_rules",
    "salient_entities",
]

LEVEL_MODEL = "model"
LEVEL_RULES = "rules"
LEVEL_PASSTHROUGH = "passthrough"
INTENT_PREFIX = "Standalone intent: "

HISTORY_MESSAGES = 12  # recent messages looked at
MAX_MESSAGE_CHARS = 2000  # longer user messages are taken as self-contained (not rewritten)
HISTORY_RESOLVE_CHARS = 600  # earlier user messages up to this length are resolved before they count
MAX_ENTITIES_PER_MESSAGE = 24  # bounds the work on long messages
OBSERVED_CHARS = 1000  # only the head of an earlier message is mined for entities
DECAY = 0.75  # salience kept per message of age
FOCUS_BONUS = 1.0  # the entity a "tell me about X" / "what is X" message is about
PLURAL_MIN_SHARE = 0.3  # a plural antecedent of "they" needs this share of the top entity's salience
TOPIC_DECAY = 0.9  # the topic score (what the conversation is about) forgets slowly
TOPIC_FIRST_TURN_WEIGHT = 2.0  # the earliest user message looked at usually sets the topic
TOPIC_MAX_CONTENT_WORDS = 0  # only a question with no specific word of its own gets the topic appended
USER_WEIGHT, ASSISTANT_WEIGHT = 1.0, 0.3


@dataclass(frozen=True, slots=True)
class RewriteResult:
    query: str
    level: str  # LEVEL_MODEL | LEVEL_RULES | LEVEL_PASSTHROUGH
    changed: bool  # query differs from the client's message
    reason: str = ""  # why the model level did not serve (memci_proxy.rewrite.levels); "" when it did or for rules alone


def intent_block(query: str) -> str:
    """The B2b text: ``"Standalone intent: <query>"`` with whitespace collapsed; "" for an empty query."""
    text = " ".join(query.split())
    return INTENT_PREFIX + text if text else ""


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a chat message (string content, or the text parts of a content list)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


# -- lexicon -------------------------------------------------------------------------------------
_FUNCTION_WORDS = frozenset(
    """
    a an the and or but nor so if then than as at by for from in into of on onto to with without about
    above after against along among around before behind below beneath beside besides between beyond
    during except inside near off out outside over past since through throughout till toward towards under
    until up upon via within across per vs versus like unlike
    i me my mine myself you your yours yourself we us our ours he him his she her hers they them their theirs
    it its itself this that these those there here who whom whose which what when where why how whether
    is am are was were be been being do does did done doing have has had having will would shall should can
    could may might must ought not no yes don't doesn't didn't isn't aren't wasn't weren't can't cannot
    won't wouldn't couldn't shouldn't haven't hasn't hadn't what's it's that's there's here's who's how's
    where's when's why's let's i'm you're we're they're i've you've we've they've i'd you'd i'll you'll
    very really just also too only even still again ever never always often sometimes usually generally
    much many more most less least few some any all each every both either neither such own other another
    same so please thanks thank ok okay yes yeah hi hello hey well now today anything something everything
    nothing else one ones themselves ourselves yourselves himself herself together maybe sure little bit
    forever anyway actually though
    """.split()
)
_VERB_BASES = """
    tell explain describe show give know think want need find get make go come take see look use help work mean
    happen cause affect compare differ change start begin become call lead live eat win die spread survive
    enable reduce relate learn say keep let put run invent create build play buy cost pay try like recommend
    list name consider continue replace attract catch govern influence reverse receive publish end increase
    decrease treat prevent avoid choose cure kill vote abolish integrate cook smoke celebrate encounter discover
    require listen visit spend damage feel seem sound smell taste stem bark obey care believe wear hope wish
    love hate enjoy worry
    miss lose hide seek ask answer talk speak read write draw paint sing dance walk move stay leave meet join
    open close stop allow exchange return send bring hold turn follow grow fall happen plan decide remember
    forget understand agree disagree prefer improve fix break install configure deploy check add remove update
    """.split()
_IRREGULAR = """
    told gave given knew known thought found got gotten made went gone came taken took saw seen began begun
    became led won spread said kept put ran built bought paid chose chosen felt hid hidden sought spoke spoken
    wrote written drew drawn sang walked wore worn lost meant left met brought held fell fallen understood
    broke broken sent grew grown does did done has had is are was were am be been being
    """.split()


def _inflections(base: str) -> set[str]:
    stem = base[:-1] if base.endswith("e") else base
    double = base + base[-1] if len(base) <= 4 and base[-1] in "bdgmnprt" and base[-2] in "aeiou" else base
    forms = {base, base + "s", base + "es", stem + "ed", stem + "ing", double + "ed", double + "ing"}
    if base.endswith("y"):
        forms |= {base[:-1] + "ies", base[:-1] + "ied"}
    return forms


_VERBS = frozenset(word for base in _VERB_BASES for word in _inflections(base)) | frozenset(_IRREGULAR)
_LY_NOUNS = frozenset("family supply assembly reply ally belly jelly rally anomaly monopoly italy july bully".split())
# common adjectives of feeling and judgement, not parts of a name
_ADJECTIVES = frozenset(
    """
    afraid scared sad happy glad angry upset worried nervous excited tired bored lonely proud sorry sure
    fine nice great cool awesome terrible awful beautiful pretty ugly easy hard difficult funny lucky ill sick
    annoying amazing boring confusing exciting surprising frustrating disappointing worrying embarrassing
    """.split()
)
_GENERIC_NOUNS = frozenset(
    """
    thing things way ways kind kinds type types sort sorts lot lots part parts example examples case cases
    history symptom symptoms cause causes effect effects difference differences similarity similarities
    evidence role roles pros cons advantage advantages disadvantage disadvantages benefit benefits risk
    risks sign signs feature features characteristic characteristics detail details info information fact
    facts question questions answer answers problem problems reason reasons idea ideas topic more most
    time times
    people person someone anyone everyone term terms version versions origin origins impact role
    relationship relationships side system systems class classes step steps option options use uses
    theme themes character characters event events activity activities attraction attractions location
    locations cost costs price prices requirement requirements rule rules application applications source
    sources factor factors result results finding findings study studies function functions component
    components variety varieties layer layers member members award awards ingredient ingredients tip tips
    method methods approach approaches alternative alternatives challenge challenges issue issues trend
    trends treatment treatments
    """.split()
)
_GENERIC_ADJECTIVES = frozenset(
    """
    more most main other different first last best worst good bad big small large largest biggest new old same
    similar possible key important major common certain specific general overall particular interesting typical
    """.split()
)
_GENERIC_NOUNS = _GENERIC_NOUNS | _GENERIC_ADJECTIVES
_TRAILING_DROP = frozenset(
    "of the and bad good better worse best worst big small new old true false able possible important famous".split()
)
_FOCUS = re.compile(
    r"^\s*(?:(?:can you |could you |please )?tell me (?:more |something )?about|what (?:is|are|was|were)|"
    r"who (?:is|are|was|were)|describe|explain|(?:i want to|i'd like to) (?:know|learn) about)\s+",
    re.IGNORECASE,
)
_ZH_SPLIT = re.compile(
    "为什么|怎么样|推荐|几家|几个|几种|怎么办|怎么|什么|如何|哪些|哪里|哪个|多少|是不是|有没有|可以|能不能|"
    "介绍一下|介绍|一下|告诉|请问|知道|了解|我们|你们|他们|她们|它们|这个|那个|这些|那些|这样|那样|这里|那里|其他|其它|还有|一些|一个|关于|"
    "因为|所以|但是|如果|然后|还是|或者|就是|已经|现在|时候|特别|非常|比较|"
    "[的了吗呢吧啊呀哦嗯是在和与及或也都很有我你他她它这那个么要会能可把被给对从就还又想请说讲问些]"
)

_TOKEN = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9\-]*(?:['\u2019][A-Za-z]+)?|[\u4e00-\u9fff]+"
    r"|[.!?;:,\u3002\uff01\uff1f\uff1b\uff0c()\[\]\"'\u2019]"
)
_SENTENCE_END = frozenset(".!?;:\u3002\uff01\uff1f\uff1b")
_CJK_RUN = re.compile(r"[\u4e00-\u9fff]+")


@dataclass(frozen=True, slots=True)
class _Entity:
    key: str  # lower-case words (head singularised) or the CJK run
    surface: str  # as written, "the " kept
    head: str
    plural: bool
    proper: bool
    words: int


def _singular(word: str) -> str:
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-3] + "y" if word.endswith("ies") else word[:-1]
    return word


def _is_content(word: str) -> bool:
    low = word.lower()
    if len(word) > 1 and word.isupper():  # acronyms: US, AI, IT
        return True
    if low.endswith("ly") and len(low) > 4 and low not in _LY_NOUNS:  # adverbs: exactly, really
        return False
    if low in _FUNCTION_WORDS or low in _VERBS or low in _ADJECTIVES:
        return False
    return len(low) > 1 or low.isdigit()


def _is_proper(word: str, sentence_initial: bool) -> bool:
    if any(c.isupper() for c in word[1:]):
        return True
    return word[0].isupper() and not sentence_initial


def _make_entity(words: list[str], definite: bool, proper: bool) -> _Entity | None:
    if not proper:  # leading generic adjectives ("main", "biggest", "other") are not part of the name
        while words and words[0].lower() in _GENERIC_NOUNS:
            words = words[1:]
            definite = False
    lows = [w.lower() for w in words]
    content = [w for w in lows if w not in ("of", "the", "and")]
    if not content or all(w in _GENERIC_NOUNS for w in content):
        return None
    if not proper and content[-1] in _GENERIC_NOUNS:  # "the side effects", "safety features": attributes
        return None
    head = _singular(content[-1])
    key = " ".join([*lows[:-1], head])
    surface = ("the " if definite else "") + " ".join(words)
    plural = head != content[-1] or "and" in lows
    return _Entity(key, surface, head, plural, proper, len(content))


@memoised(4096, ENTITY_MEMO_BYTES)
def english_entities(text: str) -> tuple[_Entity, ...]:
    """Noun-phrase candidates of ``text``, in order (memoised: history messages recur turn after turn)."""
    tokens = [m.group() for m in _TOKEN.finditer(text)]
    entities: list[_Entity] = []
    run: list[str] = []
    run_proper = definite = False
    sentence_initial = True

    def flush() -> None:
        nonlocal run, run_proper, definite
        while run and (run[-1].lower() in _TRAILING_DROP or len(run) > 1 and run[-1].lower().endswith("ed")):
            run.pop()
        if run:
            entity = _make_entity(run, definite, run_proper)
            if entity is not None:
                entities.append(entity)
        run, run_proper, definite = [], False, False

    for i, token in enumerate(tokens):
        if not (token[0].isalnum()) or _CJK_RUN.fullmatch(token):
            flush()
            sentence_initial = token in _SENTENCE_END or sentence_initial and not token[0].isalnum()
            continue
        possessive = token.lower().endswith(("'s", "\u2019s")) and token.lower()[:-2] not in _FUNCTION_WORDS
        word = token[:-2] if possessive else token
        proper = _is_proper(word, sentence_initial)
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if _is_content(word):
            run.append(word)
            run_proper = run_proper or proper
        elif run and run_proper and word.lower() in ("of", "the", "and") and nxt[:1].isupper():
            run.append(word)  # "Museum of Art", "Bank of the West", "Lewis and Clark"
        else:
            flush()
            definite = word.lower() == "the"
        if possessive:
            flush()
        sentence_initial = False
    flush()
    return tuple(entities)


@memoised(4096, ENTITY_MEMO_BYTES)
def chinese_entities(text: str) -> tuple[_Entity, ...]:
    entities = []
    for run in _CJK_RUN.findall(text):
        for piece in _ZH_SPLIT.split(run):
            if 2 <= len(piece) <= 10:
                entities.append(_Entity(piece, piece, piece, False, False, 1))
    return tuple(entities)


def _entities(text: str) -> tuple[_Entity, ...]:
    return english_entities(text) + chinese_entities(text)


# -- salience ------------------------------------------------------------------------------------
class _Salience:
    def __init__(self) -> None:
        self.score: dict[str, float] = {}
        self.entity: dict[str, _Entity] = {}
        self.last: dict[str, int] = {}
        self.topic_score: dict[str, float] = {}  # slower decay: what the conversation is about
        self.clock = 0

    def decay(self) -> None:
        self.clock += 1
        for key in self.score:
            self.score[key] *= DECAY
            self.topic_score[key] *= TOPIC_DECAY

    def observe(self, text: str, weight: float, topic_weight: float) -> None:
        known = sorted(self.score, key=self.score.__getitem__, reverse=True)[:MAX_ENTITIES_PER_MESSAGE]
        lowered = " " + " ".join(_singular(w) for w in re.findall(r"[a-z0-9\-]+", text.lower())) + " "
        focus = _FOCUS.match(text)
        focus_key = None
        if focus is not None:
            after = english_entities(text[focus.end() :])
            focus_key = after[0].key if after else None
        first_cjk = True
        for entity in _entities(text)[:MAX_ENTITIES_PER_MESSAGE]:
            bonus = 1.0 + 0.25 * (entity.words - 1) + (0.5 if entity.proper else 0.0)
            if entity.key == focus_key:
                bonus += FOCUS_BONUS
            if first_cjk and _CJK_RUN.fullmatch(entity.key):  # Chinese puts the topic first
                bonus += 0.5
                first_cjk = False
            self._add(entity, weight * bonus, topic_weight * bonus)
        for key in known:  # known entities named inside a longer phrase count too
            if self.last.get(key) != self.clock and f" {key} " in lowered:
                self._add(self.entity[key], weight, topic_weight)

    def _add(self, entity: _Entity, amount: float, topic_amount: float) -> None:
        self.score[entity.key] = self.score.get(entity.key, 0.0) + amount
        self.topic_score[entity.key] = self.topic_score.get(entity.key, 0.0) + topic_amount
        previous = self.entity.get(entity.key)
        if previous is None or entity.surface.startswith("the ") or len(entity.surface) > len(previous.surface):
            self.entity[entity.key] = entity
        self.last[entity.key] = self.clock

    def ranked(self) -> list[tuple[_Entity, float]]:
        order = sorted(self.score, key=lambda k: (-self.score[k], -self.last[k], k))
        return [(self.entity[k], self.score[k]) for k in order]

    def topic(self) -> _Entity | None:
        """The entity with the highest slow-decaying score, English only (the topic of the conversation)."""
        best = None
        for key, value in self.topic_score.items():
            if _CJK_RUN.search(key) is None and (best is None or value > self.topic_score[best]):
                best = key
        return self.entity[best] if best is not None else None


@memoised(1024, ENTITY_MEMO_BYTES // 2)
def _word_set(text: str) -> frozenset[str]:
    return frozenset(_singular(w) for w in re.findall(r"[a-z0-9\-]+", text.lower()))


def _present(entity: _Entity, text: str) -> bool:
    """Whether ``text`` names ``entity`` (all its words, plural or singular; CJK: the run itself)."""
    if entity.head and _CJK_RUN.fullmatch(entity.head):
        return entity.key in text
    words = _word_set(text)
    return all(_singular(w) in words for w in entity.key.split() if w not in ("of", "the", "and"))


def _pick(salience: _Salience, text: str, plural: bool | None = None, cjk: bool | None = None) -> _Entity | None:
    ranked = [(e, s) for e, s in salience.ranked() if not _present(e, text)]
    if cjk is not None:
        preferred = [(e, s) for e, s in ranked if bool(_CJK_RUN.fullmatch(e.key)) == cjk]
        ranked = preferred or ranked
    if plural is False:  # "it" is not a person
        ranked = [(e, s) for e, s in ranked if e.head not in _PERSON_NOUNS]
    if not ranked:
        return None
    if plural:  # "they" needs a plural antecedent of some salience
        top = ranked[0][1]
        return next((e for e, s in ranked if e.plural and s >= PLURAL_MIN_SHARE * top), None)
    return ranked[0][0]


# -- pronouns ------------------------------------------------------------------------------------
_EXPLETIVE_IT = re.compile(
    r"\bit\s+(?:(?:is|was|'s|would\s+be|will\s+be)\s+\w+\s+(?:to|that|if|when|for)\b|means?\s+to\b|takes?\b|seems?\b)",
    re.IGNORECASE,
)
_IDIOM_IT = re.compile(
    r"\b(?:give\s+it\s+a\s+(?:try|shot|go)|make\s+it\b|get\s+it\b|got\s+it\b|take\s+it\s+easy|"
    r"it\s+(?:looks\s+like|turns\s+out|depends))",
    re.IGNORECASE,
)
# "this"/"that" stand for an entity only as the subject of a verb ("How does that work?"): not as a
# determiner, a conjunction or a reference to a whole event ("why would he say that?").
_STANDALONE = (
    r"(?=\s+(?:is|was|does|did|has|have|can|could|will|would|should|mean|means|work|works|happen|happens|cost|costs)\b)"
)
_EN_PRONOUN = re.compile(
    r"\b(?:(?P<its>its)|(?P<their>their)|(?P<it>it)(?!['\u2019])|(?P<they>they|them)(?!['\u2019])|"
    rf"(?P<demo>this|that|these|those){_STANDALONE})\b",
    re.IGNORECASE,
)
_PERSON_NOUNS = frozenset(
    """
    person people teacher mom mum mother dad father parent friend brother sister son daughter kid child
    children boy girl man woman men women guy doctor boss classmate wife husband baby family grandma grandpa
    grandmother grandfather uncle aunt cousin neighbor neighbour colleague coach
    """.split()
)
_ZH_PRONOUN = re.compile(r"它们|他们|她们|它(?!们)|(?:这个|那个)(?=$|[\s，。？！?!,.是有会能可怎为在的呢吗多还要该])|(?<!其)[这那](?=[是有会能可怎为在])")


_SENTENCE = re.compile(r"[^.!?\u3002\uff01\uff1f\n]+[.!?\u3002\uff01\uff1f\n]*")
_REQUEST = re.compile(
    r"^\s*(?:(?:and|so|but|ok|okay|then|also|now)[,\s]+)?(?:please\s+)?(?:tell|explain|describe|show|list|give|"
    r"compare|summari[sz]e|define|find|recommend|help|teach|how|what|why|when|where|who|which|whose|whom)\b",
    re.IGNORECASE,
)
_PERSONAL = re.compile(r"\b(?:he|she|him|her|his|hers)\b", re.IGNORECASE)
_ZH_QUESTION = re.compile("[吗呢么啥哪谁几多]|什么|怎么|如何|为什么|介绍|解释|说说|讲讲|告诉|推荐|比较")


def _is_query(sentence: str) -> bool:
    """A question or a request: the sentences whose pronouns are resolved (not narration or feelings)."""
    stripped = sentence.rstrip()
    return stripped.endswith(("?", "\uff1f")) or bool(_REQUEST.match(sentence)) or bool(_ZH_QUESTION.search(sentence))


def _possessive(surface: str) -> str:
    return surface + ("'" if surface.endswith("s") else "'s")


_PREVIOUS_WORD = re.compile(r"([A-Za-z0-9][A-Za-z0-9\-']*)\W*$")
# The word before a pronoun is looked for in the characters just before it: a search over the whole text would
# cost time quadratic in its length (the pattern is tried at every start of a long run of letters).
PREVIOUS_WORD_WINDOW = 64


def _after_noun(text: str, offset: int) -> bool:
    match = _PREVIOUS_WORD.search(text, max(0, offset - PREVIOUS_WORD_WINDOW), offset)
    return match is not None and _is_content(match.group(1))


def _resolve_pronouns(text: str, salience: _Salience) -> str:
    text_scan = text
    for pattern in (_EXPLETIVE_IT, _IDIOM_IT):
        if pattern.search(text_scan):
            text_scan = pattern.sub(lambda m: "\x00" * len(m.group()), text_scan)
    sentences = [(m.start(), m.end(), _is_query(m.group())) for m in _SENTENCE.finditer(text)]
    starts = [start for start, _, _ in sentences]
    picks: dict[tuple[bool | None, bool | None], _Entity | None] = {}  # _pick's answer for this text, memoised

    def sentence_of(offset: int) -> int | None:  # index of the question/request sentence holding offset
        k = bisect.bisect_right(starts, offset) - 1
        if k >= 0 and sentences[k][0] <= offset < sentences[k][1]:
            return k if sentences[k][2] else None
        return None

    def pick(plural: bool | None, cjk: bool) -> _Entity | None:  # the same for every pronoun of the text
        if (plural, cjk) not in picks:
            picks[(plural, cjk)] = _pick(salience, text, plural=plural, cjk=cjk)
        return picks[(plural, cjk)]

    pieces: list[str] = []
    position = 0
    used: set[str] = set()  # an entity replaces its first pronoun only ("What are X's roots and what influenced it?")
    for match in _EN_PRONOUN.finditer(text_scan):
        k = sentence_of(match.start())
        if k is None:
            continue
        kind = match.lastgroup
        if kind == "demo" and _after_noun(text, match.start()):
            continue  # relative "that": "the events that happen"
        plural = match.group().lower() in ("they", "them", "their", "these", "those")
        # the antecedent may be in this sentence or the one before ("What is X and why is it important?")
        if any(e.plural == plural for e in english_entities(text[sentences[max(k - 1, 0)][0] : match.start()])):
            continue  # "What is X and why is it important?": the antecedent is in the message itself
        entity = pick(plural, False)
        if entity is None or entity.key in used:
            continue
        used.add(entity.key)
        replacement = _possessive(entity.surface) if kind in ("its", "their") else entity.surface
        pieces.append(text[position : match.start()])
        pieces.append(replacement)
        position = match.end()
    for match in _ZH_PRONOUN.finditer(text):
        if match.start() < position or sentence_of(match.start()) is None:
            continue
        entity = pick(None, True)
        if entity is None or entity.key in used:
            continue
        used.add(entity.key)
        pieces.append(text[position : match.start()])
        pieces.append(entity.surface)
        position = match.end()
    pieces.append(text[position:])
    return "".join(pieces)


# -- ellipsis ------------------------------------------------------------------------------------
_WHAT_ABOUT = re.compile(
    # The tail is atomic ((?>...)): spaces, stops, spaces can be split only one way, and trying every split
    # at every end of the lazy x made a message of spaces cost seconds (cubic). Same matches as without.
    r"^\s*(?:\w+[.!,]\s+)?(?:(?:so|and|but|ok|okay|then|now)[,\s]+)?(?:what|how)\s+about\s+(?P<x>.+?)"
    r"(?>\s*)(?>[?.!]*)(?>\s*)$",
    re.IGNORECASE | re.DOTALL,
)
_AND_X = re.compile(r"^\s*(?:and|or)\s+(?P<x>[^?.!]{1,60}?)\s*\?\s*$", re.IGNORECASE)
_ZH_X_NE = re.compile(r"^\s*(?:那么|那)?(?P<x>[^，。？！?!,\s]{1,16}?)(?:呢|怎么样|如何)\s*[？?。!！]*\s*$")
_ELSE = re.compile(
    r"^\s*(?:(?:what|anything|who|where)\s+else|any\s+others?|others?|more)(?>\s*)(?>[?.!]*)(?>\s*)$"
    r"|^\s*(?:其他的?|其它的?|还有|别的)(?:呢|吗|还有吗)?\s*[？?。!！]*\s*$",
    re.IGNORECASE,
)
_TRAILING_FILLER_WORDS = re.compile(r"(?:in particular|instead|then|too|as well|though|specifically)$", re.IGNORECASE)


def _without_trailing_filler(text: str) -> str:
    """``text`` without a final filler phrase and the whitespace before it ("... instead" -> "..."). Linear:
    the pattern ``\\s+(?:filler)$`` run as a search is quadratic on a long run of spaces."""
    match = _TRAILING_FILLER_WORDS.search(text)
    if match is None or match.start() == 0 or not text[match.start() - 1].isspace():
        return text
    return text[: match.start()].rstrip() + text[match.end():]  # ($ may match before a final newline)
_FILLER = re.compile(r"^(?:for|in|on|with|the|a|an)\s+", re.IGNORECASE)


def _strip_end(text: str) -> tuple[str, str]:
    stripped = text.rstrip()
    body = stripped.rstrip(".?!。？！ ")
    return body, stripped[len(body) :].strip() or "?"


def _substitute(previous: str, x: str) -> str | None:
    """``previous`` with the entity that ``x`` stands in for replaced by ``x``; None when none fits."""
    x_core = _without_trailing_filler(_FILLER.sub("", x.strip()))
    cjk = bool(_CJK_RUN.fullmatch(x_core))
    candidates = chinese_entities(previous) if cjk else english_entities(previous)
    if not candidates:
        return None
    x_entities = chinese_entities(x_core) if cjk else english_entities(x_core)
    chosen = None
    x_proper = False
    if x_entities and not cjk:
        head = x_entities[-1].head
        chosen = next((c for c in candidates if c.head == head), None)
        x_proper = any(word[:1].isupper() for word in x_core.split())
        if chosen is None and x_proper:
            chosen = next((c for c in candidates if c.proper), None)
    if chosen is None and (cjk or len(candidates) == 1 and x_entities and x_proper):
        chosen = candidates[0]
    if chosen is None:
        return None
    bare = chosen.surface[4:] if chosen.surface.startswith("the ") else chosen.surface
    if x_proper and chosen.surface.startswith("the ") and previous.find(chosen.surface) >= 0:
        bare = chosen.surface  # "the First Lady" -> "Ivanka"
    index = previous.find(bare)
    if index < 0:
        return None
    return previous[:index] + x_core + previous[index + len(bare) :]


def _rewrite_ellipsis(text: str, previous: str, salience: _Salience) -> str | None:
    """"what about X", "and X?", "那X呢", "what else": None when the message is none of these."""
    if _ELSE.match(text) and previous:
        return f"{text.strip()} ({previous.strip()})"
    match = _WHAT_ABOUT.match(text) or _AND_X.match(text) or _ZH_X_NE.match(text)
    if match is not None and previous:
        x = match.group("x")
        if not _EN_PRONOUN.fullmatch(x.strip()) and not _ZH_PRONOUN.fullmatch(x.strip()):
            substituted = _substitute(previous, x)
            if substituted is not None:
                return substituted
    return None


_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9\-]*")


def _complete_with_topic(text: str, salience: _Salience) -> str | None:
    """An English question about an attribute ("Are there any benefits?") that names neither the topic nor
    any known entity nor a name, nor any specific word: the topic appended ("... of <topic>", "... in
    <Proper Topic>"); None otherwise."""
    if _CJK_RUN.search(text) or len(text) > 300 or not _is_query(text):
        return None
    topic = salience.topic()
    if topic is None or _present(topic, text) or _EN_PRONOUN.search(text) or _PERSONAL.search(text):
        return None
    words = _WORD.findall(text)
    if any(_is_proper(w, i == 0) for i, w in enumerate(words)):
        return None
    if any(_present(e, text) for e, _ in salience.ranked()[:10]):
        return None
    specific = [w for w in words if _is_content(w) and w.lower() not in _GENERIC_NOUNS]
    attributes = [w for w in words if w.lower() in _GENERIC_NOUNS and w.lower() not in _GENERIC_ADJECTIVES]
    if len(specific) > TOPIC_MAX_CONTENT_WORDS or not attributes:
        return None  # it must ask about an attribute ("the benefits", "how many types") of nothing named
    body, end = _strip_end(text)
    preposition = "in" if topic.proper else "of"
    return f"{body} {preposition} {topic.surface}{end}"


# -- entry points --------------------------------------------------------------------------------
def _build_salience(history: Sequence[Mapping[str, Any]]) -> tuple[_Salience, str]:
    """Salience over the recent messages (earlier user turns resolved first) and the last user question."""
    salience = _Salience()
    previous = ""
    first = True
    for message in list(history)[-HISTORY_MESSAGES:]:
        role = message.get("role")
        text = message_text(message)
        if not text or role not in ("user", "assistant"):
            continue
        salience.decay()
        if role == "user":
            resolved = _resolve_pronouns(text, salience) if len(text) <= HISTORY_RESOLVE_CHARS else text
            salience.observe(
                resolved[:OBSERVED_CHARS],
                USER_WEIGHT,
                USER_WEIGHT * (TOPIC_FIRST_TURN_WEIGHT if first else 1.0),
            )
            first = False
            previous = resolved if len(resolved) <= MAX_MESSAGE_CHARS else ""
        else:
            salience.observe(text[:OBSERVED_CHARS], ASSISTANT_WEIGHT, ASSISTANT_WEIGHT)
    return salience, previous


def salient_entities(history: Sequence[Mapping[str, Any]], top: int = 5) -> list[tuple[str, float]]:
    """The ``top`` salient entities of the recent messages (surface form, score), best first."""
    salience, _ = _build_salience(history)
    return [(e.surface, round(s, 4)) for e, s in salience.ranked()[:top]]


def rewrite_rules(history: Sequence[Mapping[str, Any]], last_user: str) -> RewriteResult:
    """Standalone form of ``last_user`` given the conversation before it (chat messages, oldest first).

    Deterministic; ``level`` is always ``"rules"``; ``changed`` tells whether anything was resolved.
    """
    if not last_user.strip() or len(last_user) > MAX_MESSAGE_CHARS:
        return RewriteResult(last_user, LEVEL_RULES, False)
    salience, previous = _build_salience(history)
    if not salience.score:
        return RewriteResult(last_user, LEVEL_RULES, False)
    rewritten = _rewrite_ellipsis(last_user, previous, salience)
    if rewritten is None:
        rewritten = _resolve_pronouns(last_user, salience)
        if rewritten == last_user:
            rewritten = _complete_with_topic(last_user, salience) or last_user
    rewritten = " ".join(rewritten.split())
    changed = rewritten != " ".join(last_user.split())
    return RewriteResult(rewritten if changed else last_user, LEVEL_RULES, changed)
