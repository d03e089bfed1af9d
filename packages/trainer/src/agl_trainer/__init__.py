"""agl-trainer: the embedded inference engine and the LightningRL training loop.

Nothing heavy is imported here (torch and transformers load with the modules that need them).
"""

__version__ = "0.1.0"
