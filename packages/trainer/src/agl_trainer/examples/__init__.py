"""Built-in examples for `agl train --example NAME`."""
