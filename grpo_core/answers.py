"""Compatibility re-export: the answer checker lives in grpo_core.verify.answers.

Kept so that scripts written against `grpo_core.answers` keep working; project code
imports grpo_core.verify.answers. Re-exports that module's public API (its __all__)."""
from grpo_core.verify.answers import *  # noqa: F403
from grpo_core.verify.answers import __all__  # noqa: F401
