"""The gate's `held` (agl.server.call_gate): true only while a hold is in force, false once it lapsed, even when no
call arrives after the lapse to open the gate."""

from __future__ import annotations

import asyncio

from agl.server.call_gate import CallGate, CallMeter


def test_held_is_true_while_held_and_false_after_the_hold_lapsed() -> None:
    async def scenario() -> list[bool]:
        gate = CallGate(CallMeter())
        seen = [gate.held]
        await gate.hold(drain_timeout_s=1.0, max_hold_s=0.2)
        seen.append(gate.held)
        await asyncio.sleep(0.3)
        seen.append(gate.held)
        await gate.hold(drain_timeout_s=1.0, max_hold_s=5.0)  # held again after the lapse
        seen.append(gate.held)
        gate.release()
        seen.append(gate.held)
        return seen

    assert asyncio.run(scenario()) == [False, True, False, True, False]


def test_a_lapsed_hold_lets_a_waiting_call_pass() -> None:
    async def scenario() -> bool:
        gate = CallGate(CallMeter())
        await gate.hold(drain_timeout_s=1.0, max_hold_s=0.1)
        await asyncio.wait_for(gate.passed(), timeout=2.0)
        return gate.held

    assert asyncio.run(scenario()) is False
