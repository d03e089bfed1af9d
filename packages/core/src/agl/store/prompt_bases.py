"""A prompt stored as the ids it adds to an earlier call's prompt and response (schema 6).

Each turn of a multi-turn agent sends the whole chat again: the prompt of call k holds the prompt and the answer
of call k − 1 and then some. Stored whole, an attempt's prompts grow with the square of its turns; most of the
store's bytes, and most of the pages a training read goes through, were the same ids again and again. So a
call whose prompt begins with an earlier call's prompt (+ response) of its attempt stores only the rest, and
names that call (its base: `prompt_base_seq`) and how many of its ids come first (`prompt_base_len`).

A base is always a call stored whole, so a prompt is rebuilt from one other row, never from a chain. A call that
shares less than half of its prompt with the base is stored whole and becomes the base of the calls after it.
Readers read an attempt's calls in `seq` order (every read does: `agl.store.reads`), which brings each base
before the calls that name it. Rows written before schema 6, and ids kept as JSON text (agl.store.codec), are
whole prompts with no base.
"""

from __future__ import annotations

import sqlite3

_ID_BYTES = 4  # an int32 id, as agl.common.packed stores them

# the attempt's latest earlier call stored whole, with binary ids: the partial index of calls stored whole
# (agl.store.schema.INDEXES) steps over the calls that name a base
_BASE = (
    "SELECT seq, prompt_ids, response_ids FROM llm_calls INDEXED BY llm_calls_bases WHERE attempt_id=? AND seq<?"
    " AND prompt_base_seq IS NULL AND typeof(prompt_ids)='blob' ORDER BY seq DESC LIMIT 1"
)


def against_base(
    conn: sqlite3.Connection, attempt_id: str, seq: int, prompt: bytes | str | None
) -> tuple[bytes | str | None, int | None, int | None]:
    """How to store this prompt (its packed ids, agl.store.codec): (the ids to store, base seq, base length in
    ids), or (the prompt, None, None) to store it whole. Runs in the writer, in the transaction that inserts the
    call: a base it names is stored before the call or with it."""
    if type(prompt) is not bytes or seq <= 0:
        return prompt, None, None
    row = conn.execute(_BASE, (attempt_id, seq)).fetchone()
    if row is None:
        return prompt, None, None
    base_prompt: bytes = row[1]
    base_response = row[2] if type(row[2]) is bytes else b""
    if not prompt.startswith(base_prompt):
        return prompt, None, None
    shared = len(base_prompt)
    if prompt.startswith(base_response, shared):  # the base's answer too (b"" always matches: nothing added)
        shared += len(base_response)
    if 2 * shared < len(prompt):
        return prompt, None, None
    return prompt[shared:], int(row[0]), shared // _ID_BYTES


class PromptBases:
    """Rebuilds whole prompts while an attempt's calls are read in `seq` order (one reader per read)."""

    __slots__ = ("_attempt", "_bases")

    def __init__(self) -> None:
        self._attempt: str | None = None
        self._bases: dict[int, bytes] = {}  # seq → prompt + response of the attempt's calls stored whole

    def whole(
        self,
        attempt_id: str,
        seq: int,
        prompt: bytes | str | None,
        response: bytes | str | None,
        base_seq: int | None,
        base_len: int | None,
    ) -> bytes | str | None:
        """The call's whole prompt as stored ids (BLOB bytes, or JSON text from before schema 4)."""
        if attempt_id != self._attempt:
            self._attempt, self._bases = attempt_id, {}
        if base_seq is None:
            if type(prompt) is bytes:
                self._bases[seq] = prompt + response if type(response) is bytes else prompt
            return prompt
        head = self._bases.get(base_seq)
        if head is None or type(prompt) is not bytes or base_len is None:
            raise RuntimeError(
                f"LLM call {seq} of attempt {attempt_id} is stored after call {base_seq}'s prompt, which this read "
                "did not meet first: read every call of an attempt, in seq order"
            )
        return head[: base_len * _ID_BYTES] + prompt
