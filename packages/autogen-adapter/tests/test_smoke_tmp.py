import agl
from calculator_team import solve, solve_streaming, SOLVER_PROMPT, VERIFIER_PROMPT

TASK = {"question": "What is 12+30?", "answer": 42,
        "solver_prompt": SOLVER_PROMPT + "\nagl-tools: calculator\nagl-say: The answer is {tool}.",
        "verifier_prompt": VERIFIER_PROMPT + "\nagl-say: APPROVE, it is 42."}

def test_smoke(agl_server, agl_client):
    for app in (solve, solve_streaming):
        (r,) = agl_client.enqueue(TASK)
        stats = agl.Runner(app, agl_server.url, concurrency=1, heartbeat_s=0.5).run(max_rollouts=1)
        d = agl_client.rollout_detail(r.id)
        print(d.rollout.status, stats, d.rollouts if hasattr(d,'rollouts') else '')
        for c in sorted(d.llm_calls, key=lambda c: c.seq):
            print(c.seq, c.agent_name, c.attribution, c.stream, c.response_message)
        for s in d.spans:
            print(s.name, s.status, s.status_message, s.agent_name, s.parent_id, s.span_id)
        print(d.rewards)
