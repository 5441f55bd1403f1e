// A three-turn conversation with a tool through the Vercel AI SDK, with the provider's defaults.
//
// usage: node ai_sdk_chat.mjs <base URL> <provider> <stream: 0|1> <session id, or "" for none>
//   provider: responses (createOpenAI, its default model: the Responses API), chat (createOpenAI .chat()),
//   compatible (@ai-sdk/openai-compatible), anthropic (@ai-sdk/anthropic).
// Each turn's user message asks the mock upstream for one tool call; the SDK runs the tool and sends
// the result back, and the next turn carries the whole conversation so far, as the SDK sends it.
// Prints one JSON line per HTTP request the SDK made ({"request": body}) and one per answer ({"answered":
// the session and capture headers the server sent}), then {"turns": [text, ...]}.
import { createAnthropic } from "@ai-sdk/anthropic";
import { createOpenAI } from "@ai-sdk/openai";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { generateText, jsonSchema, stepCountIs, streamText, tool } from "ai";

const [baseURL, provider, streamFlag, sessionId] = process.argv.slice(2);
const stream = streamFlag === "1";
const headers = sessionId ? { "x-session-id": sessionId } : {};
const apiKey = process.env.SWITCHYARD_MODEL_KEY || "dummy";

// Every request body the SDK sends, and the session each answer names.
async function loggingFetch(url, init) {
  if (init && typeof init.body === "string") {
    console.log(JSON.stringify({ request: JSON.parse(init.body) }));
  }
  const response = await fetch(url, init);
  const answered = {
    session: response.headers.get("x-switchyard-session-id"),
    capture: response.headers.get("x-switchyard-model-capture"),
  };
  console.log(JSON.stringify({ answered }));
  return response;
}

function model(route) {
  const options = { baseURL, apiKey, headers, fetch: loggingFetch };
  switch (provider) {
    case "responses":
      return createOpenAI(options)(route);
    case "chat":
      return createOpenAI(options).chat(route);
    case "compatible":
      return createOpenAICompatible({ name: "switchyard", ...options })(route);
    case "anthropic":
      return createAnthropic(options)(route);
    default:
      throw new Error(`unknown provider ${provider}`);
  }
}

const weather = tool({
  description: "The weather in a city",
  inputSchema: jsonSchema({
    type: "object",
    properties: { city: { type: "string" } },
    required: ["city"],
    additionalProperties: false,
  }),
  execute: async ({ city }) => `sunny in ${city}`,
});

const messages = [];
const turns = [];
for (const city of ["Oslo", "Lima", "Pune"]) {
  messages.push({
    role: "user",
    content: `Weather in ${city}? [[mock:tool weather {"city": "${city}"}]]`,
  });
  const call = {
    model: model("demo"),
    messages,
    tools: { weather },
    stopWhen: stepCountIs(4),
    maxRetries: 0,
  };
  // `responseMessages`: every step's messages (the tool call, its result, the answer), as the SDK
  // documents for carrying a conversation on (`response.messages` holds the last step's alone).
  let text;
  let added;
  if (stream) {
    const result = streamText({ ...call, onError: ({ error }) => { throw error; } });
    text = await result.text;
    added = await result.responseMessages;
  } else {
    const result = await generateText(call);
    text = result.text;
    added = result.responseMessages;
  }
  turns.push(text);
  messages.push(...added);
}
console.log(JSON.stringify({ turns }));
