"""MuSiQue multi-hop question answering with retrieval: an OpenAI Agents SDK `researcher` agent that searches a
paragraph corpus (BM25 by default, dense embeddings optionally) and answers; reward = token-level F1.

Modules: `data` (loader), `retrieval` (BM25 / dense indexes, passage formatting), `evaluate` (answer parsing,
EM, F1), `agent` (the rollout function), `air` (intermediate rewards), `task` (`TASK` for the harness).
"""
