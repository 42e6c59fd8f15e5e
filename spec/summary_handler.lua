-- Busted output: the plain terminal report, then one last line that CI
-- reads, "N passed, N failed" (errors count as failures).
return function(options)
  local busted = require "busted"
  local handler = require("busted.outputHandlers.plainTerminal")(options)
  busted.subscribe({"suite", "end"}, function()
    io.write(("%d passed, %d failed\n"):format(handler.successesCount,
                                               handler.failuresCount + handler.errorsCount))
    io.flush()
    return nil, true
  end)
  return handler
end
