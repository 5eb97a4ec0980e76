#pragma once
// Memory that a forked child does not get. A process that forks again and again (a DataLoader
// starts its workers at every epoch) shares every other page with each child, and its next write
// to such a page copies it first, with a TLB shootdown of each core it runs on. A block mapped
// here is left out of the children (MADV_DONTFORK): the recorder's host copies of tensors and the
// writer's encode memory, which only the process that made them ever touches.

#include <sys/types.h>

#include <cstddef>

namespace crashcap::formats {

/// `bytes` (more than 0) mapped for this process alone; nullptr when the system has no memory.
/// Best effort: where the kernel will not leave the block out of children, they share its pages,
/// which costs time, never correctness.
void* mapForkPrivate(size_t bytes);

/// Unmaps a block that mapForkPrivate gave process `owner`. In any other process (a child forked
/// since, which does not have the block) it does nothing.
void unmapForkPrivate(void* block, size_t bytes, pid_t owner);

}  // namespace crashcap::formats
