from tests.codegen.stax_helpers import stax_cache

__all__ = ["stax_cache"]
