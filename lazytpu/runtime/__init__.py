"""Runtime: compile programs with ``jax.jit``, run them on the PJRT device,
move data between host and device. Knows nothing of torch ops."""

from lazytpu.runtime.executor import cache_info, clear_caches, execute
from lazytpu.runtime.platform import device, platform_name
from lazytpu.runtime.transfer import from_host, to_host

__all__ = ["cache_info", "clear_caches", "device", "execute", "from_host", "platform_name", "to_host"]
