"""Our own descriptor pool: tritonclient registers Triton's protos (same package `inference`, same
file names) in the default pool, and a process that imports both must not clash."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
