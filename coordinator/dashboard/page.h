// The dashboard page (coordinator/dashboard/index.html), embedded at build time
// (coordinator/CMakeLists.txt writes it into a raw string), so the binary serves it alone.
#pragma once

#include <string_view>

namespace drover::coordinator {

std::string_view DashboardPage();

}  // namespace drover::coordinator
