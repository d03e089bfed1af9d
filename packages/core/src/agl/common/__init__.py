"""What every stage shares below the public records (`agl.schema`, `agl.protocol`) and the client (`agl.client`):
small records, wire formats and utilities, importing no stage.

- `trainable`: the training read's records (`TrainableRollout`, `TrainableCall`), shared by the store that makes
  them, the wire that carries them and the learning side that reads them, so they sit below all three;
- `trainable_wire`, `call_packs`, `packed`: how those records travel (binary and JSON bodies, packed calls,
  token ids as arrays), used by the server, the store and the client alike;
- `attributes`: the span attribute names agl writes and reads (the tracer, the OTLP receiver, AIR rules, the
  client all agree on them);
- `failure`: how a failed attempt is described, written by the runner, stored by the store's lifecycle and shown
  by the dashboard and `agl show`;
- `hermes`: the one Hermes rendering of tools and tool calls (agl's engine and the scripted test upstream);
- `asgi`, `processes`, `gc_pause`: serving an ASGI app from a thread, starting `agl serve` / `agl worker`
  processes, pausing the cycle collector around bulk reads.
"""
