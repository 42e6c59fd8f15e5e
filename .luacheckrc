-- luacheck settings (luacheck is not a dependency; `luacheck .` where it is installed)
std = "lua54"
max_line_length = 120
files["spec/**/*.lua"] = {std = "+busted"}
files["examples/**/*.lua"] = {read_globals = {"mg"}}
files["bench/**/*.lua"] = {read_globals = {"mg"}}
exclude_files = {"build/**", "build-asan/**"}
