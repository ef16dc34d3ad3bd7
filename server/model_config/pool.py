"""The descriptor pool of every module generated from proto/: tritonclient registers Triton's protos (the same
package `inference`, the same file names) in protobuf's default pool, and a process that imports both must not
clash."""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
