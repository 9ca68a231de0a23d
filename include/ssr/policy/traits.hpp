// What makes a type a routing policy: validate() and resolve(Context) -> RouteSpec.
#pragma once

#include <type_traits>
#include <utility>

#include "ssr/context.hpp"
#include "ssr/spec.hpp"

namespace ssr {

template <class P, class = void>
struct is_policy : std::false_type {};

template <class P>
struct is_policy<P, std::void_t<decltype(std::declval<const P&>().validate()),
                                decltype(std::declval<const P&>().resolve(std::declval<const Context&>()))>>
    : std::is_same<decltype(std::declval<const P&>().resolve(std::declval<const Context&>())), RouteSpec> {};

}  // namespace ssr
