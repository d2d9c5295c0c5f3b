// What every C API file shares: the handle structs and the rule that no exception crosses the
// boundary (guarded: an exception becomes bevy_last_error() and the failure value).
#pragma once

#include "bevy.h"

#include "cache_hook.hpp"
#include "expert_cache.hpp"
#include "links.hpp"

#include <exception>
#include <memory>
#include <new>
#include <string>

struct bevy_link {
    std::unique_ptr<bevy::Link> link;
};

struct bevy_cache {
    std::unique_ptr<bevy::ExpertCache> cache;
};

struct bevy_hook {
    bevy::CacheHook hook;
};

namespace bevy::capi {

// this thread's last error (bevy_last_error)
std::string & last_error();

template <typename F>
auto guarded(F && f, decltype(f()) on_error) noexcept -> decltype(f()) {
    try {
        return f();
    } catch (const std::bad_alloc &) {
        last_error() = "out of memory";
    } catch (const std::exception & e) {
        last_error() = e.what();
    } catch (...) {
        last_error() = "unknown error";
    }
    return on_error;
}

} // namespace bevy::capi
