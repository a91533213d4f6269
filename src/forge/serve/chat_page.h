// The chat page `forge serve` answers at GET /: one self-contained HTML document (inline CSS
// and JavaScript, no external assets, no build step) that talks to the server's own API.
//
//  - A chat mode (the conversation → POST /v1/chat/completions) and a prompt mode (the text →
//    POST /v1/completions), both streamed ("stream": true, read with fetch + ReadableStream
//    and parsed as server-sent events), the answer growing as chunks arrive; a Stop button
//    aborts the request (the server ends that generation).
//  - Sampling controls: temperature, top_p, max_tokens, seed (empty: none); an API-key field
//    sent as "Authorization: Bearer KEY" when not empty (the page itself carries no secret and
//    is served without the key).
//  - After an answer: completion tokens (the usage chunk, stream_options.include_usage) over
//    the time from the request to the last chunk = tokens/s, and the time to the first chunk.
//  - Headless use: URL parameters prefill the form (mode=chat|prompt, prompt, temperature,
//    top_p, max_tokens, seed) and autorun=1 submits on load. The page records its progress in
//    the DOM: <body data-state="idle|running|done|stopped|error">, and #answer holds the
//    streamed text with data-chunks = the number of non-empty text chunks received.
#pragma once

#include <string>

namespace forge::serve {

// The page's HTML (UTF-8), built once.
const std::string& chat_page_html();

}  // namespace forge::serve
