// Clang's thread-safety annotations (https://clang.llvm.org/docs/ThreadSafetyAnalysis.html),
// so that "this member is guarded by mu_" is a fact the compiler checks, not a comment.
// Under Clang with -Wthread-safety every access to a GUARDED_BY member without its mutex
// held, and every call to a REQUIRES function without it, is a compile error (the build
// turns it on for Clang; tests/tools/thread_safety_check.sh runs the analysis on every
// `make test`, whose build is GCC's). Under other compilers the macros expand to nothing.
//
// Use them with drover::Mutex / MutexLock / CondVar (common/mutex.h): std::mutex carries no
// annotations, so the analysis cannot see it being locked.
#pragma once

#if defined(__clang__)
#define DROVER_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define DROVER_THREAD_ANNOTATION(x)
#endif

// On a class: it is a lock ("mutex").
#define CAPABILITY(x) DROVER_THREAD_ANNOTATION(capability(x))
// On a class: an RAII object that holds a lock for its lifetime.
#define SCOPED_CAPABILITY DROVER_THREAD_ANNOTATION(scoped_lockable)
// GUARDED_BY, PT_GUARDED_BY and NO_THREAD_SAFETY_ANALYSIS may come defined already, with the
// same meaning, by Abseil's legacy header (absl/base/internal/thread_annotations.h, which
// gRPC's headers include); that definition is kept.
//
// On a member: read or written only with `x` held.
#ifndef GUARDED_BY
#define GUARDED_BY(x) DROVER_THREAD_ANNOTATION(guarded_by(x))
#endif
// On a pointer member: what it points to is read or written only with `x` held.
#ifndef PT_GUARDED_BY
#define PT_GUARDED_BY(x) DROVER_THREAD_ANNOTATION(pt_guarded_by(x))
#endif
// On a function: the caller holds these locks.
#define REQUIRES(...) DROVER_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
// On a function: the caller must not hold these locks (it takes them itself).
#define EXCLUDES(...) DROVER_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
// On a function: it takes / releases these locks (no arguments: `this`).
#define ACQUIRE(...) DROVER_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define RELEASE(...) DROVER_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
// On a function: it aborts unless the lock is held, and the analysis may assume it is.
#define ASSERT_CAPABILITY(x) DROVER_THREAD_ANNOTATION(assert_capability(x))
// On a function: it returns this lock.
#define RETURN_CAPABILITY(x) DROVER_THREAD_ANNOTATION(lock_returned(x))
// On a function the analysis cannot follow; say why beside it.
#ifndef NO_THREAD_SAFETY_ANALYSIS
#define NO_THREAD_SAFETY_ANALYSIS DROVER_THREAD_ANNOTATION(no_thread_safety_analysis)
#endif
