// C API: errors and links (include/bevy.h).
#include "capi_common.hpp"

#include <cstdio>
#include <utility>
#include <vector>

using bevy::capi::guarded;
using bevy::capi::last_error;

namespace {

bevy_link * wrap(std::unique_ptr<bevy::Link> link, const std::string & err) {
    if (!link) {
        last_error() = err;
        return nullptr;
    }
    return new bevy_link{std::move(link)};
}

// a link made over inner (make: the unique_ptr of inner's link -> the new link), which takes inner over
template <typename Make>
bevy_link * wrap_over(bevy_link * inner, Make make) {
    return guarded([&]() -> bevy_link * {
        auto link = make(std::move(inner->link));
        delete inner;
        return new bevy_link{std::move(link)};
    }, nullptr);
}

} // namespace

std::string & bevy::capi::last_error() {
    thread_local std::string error;
    return error;
}

const char * bevy_last_error(void) {
    return last_error().c_str();
}

bevy_link * bevy_link_file_new(const char * path) {
    return guarded([&]() -> bevy_link * {
        std::string err;
        return wrap(bevy::make_file_link(path, err), err);
    }, nullptr);
}

bevy_link * bevy_link_ram_new(const char * path, const uint64_t * offsets, const uint64_t * sizes, int32_t n) {
    return guarded([&]() -> bevy_link * {
        std::vector<std::pair<uint64_t, uint64_t>> ranges;
        for (int32_t i = 0; i < n; ++i) {
            ranges.emplace_back(offsets[i], sizes[i]);
        }
        std::string err;
        return wrap(bevy::make_ram_link(path, ranges, err), err);
    }, nullptr);
}

bevy_link * bevy_link_throttle_new(bevy_link * inner, double bytes_per_s) {
    if (!inner || !(bytes_per_s > 0)) {
        last_error() = "a throttle needs a link and a positive rate";
        return nullptr;
    }
    return wrap_over(inner, [&](std::unique_ptr<bevy::Link> link) {
        return bevy::make_throttle_link(std::move(link), bytes_per_s);
    });
}

bevy_link * bevy_link_fault_new(bevy_link * inner, int64_t error_every, int64_t short_every, int64_t stall_every,
                                double stall_s) {
    if (!inner || error_every < 0 || short_every < 0 || stall_every < 0 || !(stall_s >= 0)) {
        last_error() = "a fault link needs a link and counts and a stall of at least 0";
        return nullptr;
    }
    return wrap_over(inner, [&](std::unique_ptr<bevy::Link> link) {
        return bevy::make_fault_link(std::move(link), {error_every, short_every, stall_every, stall_s});
    });
}

void bevy_link_free(bevy_link * link) {
    delete link;
}

int64_t bevy_link_describe(const bevy_link * link, char * buf, int64_t size) {
    const std::string d = link->link->describe();
    if (buf && size > 0) {
        std::snprintf(buf, (size_t) size, "%s", d.c_str());
    }
    return (int64_t) d.size();
}

int32_t bevy_link_read(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst) {
    return bevy_link_read_padded(link, offset, nbytes, dst, 0, 0);
}

int32_t bevy_link_read_padded(bevy_link * link, uint64_t offset, uint64_t nbytes, void * dst, uint64_t before,
                              uint64_t after) {
    return guarded([&]() -> int32_t {
        std::string err;
        if (!link->link->read_padded(offset, nbytes, dst, before, after, err)) {
            last_error() = err;
            return -1;
        }
        return 0;
    }, -1);
}

bool bevy_link_emulated(const bevy_link * link) {
    return link->link->emulated();
}

uint64_t bevy_link_bounced(const bevy_link * link) {
    return link->link->bounced();
}
