// Whether the tests were built with AddressSanitizer (gcc defines __SANITIZE_ADDRESS__, clang
// answers __has_feature): for checks that cannot hold under it (resident memory with its
// quarantine, a process under an address-space limit).
#pragma once

namespace forge::testing {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAsan = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kAsan = true;
#else
inline constexpr bool kAsan = false;
#endif
#else
inline constexpr bool kAsan = false;
#endif

}  // namespace forge::testing
