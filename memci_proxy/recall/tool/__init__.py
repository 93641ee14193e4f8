"""The `recall` function tool: its schema and injection (schema), the server-side loop over its rounds (loop),
and the rounds' bookkeeping (rounds)."""
