import "./locale"; // first: it must run before uPlot loads
import { render } from "preact";
import { useEffect, useState } from "preact/hooks";
import { getJson, isDesktop, type LocalModel } from "./api";
import { hasNative, openChat } from "./native";
import { ModelsPage } from "./pages/Models";
import { DiscoverPage } from "./pages/Discover";
import { LivePage } from "./pages/Live";
import { ServerPage } from "./pages/Server";
import { ChatPage } from "./pages/Chat";
import { ModelPage } from "./pages/ModelPage";
import "uplot/dist/uPlot.min.css";
import "./style.css";

const pages = {
  models: { title: "Models", view: ModelsPage },
  discover: { title: "Discover", view: DiscoverPage },
  live: { title: "Live", view: LivePage },
  server: { title: "Server", view: ServerPage },
  chat: { title: "Chat", view: ChatPage },
  model: { title: "Model", view: ModelPage },
} as const;

type Route = keyof typeof pages;

function currentRoute(): Route {
  const name = window.location.hash.replace(/^#\/?/, "").split(/[/?]/)[0];
  return name in pages ? (name as Route) : "models";
}

/**
 * A first run (no model on disk) opens on Discover's recommendations rather than an empty
 * table: only when the app was opened on its default page, never away from a page asked for.
 */
async function openOnDiscoverIfEmpty() {
  const opened = window.location.hash.replace(/^#\/?/, "");
  if (opened !== "" && opened !== "models") return;
  try {
    const models = await getJson<LocalModel[]>("/admin/models");
    if (models.length === 0 && currentRoute() === "models") window.location.hash = "#/discover";
  } catch {
    // The Models page shows why the list cannot be read.
  }
}

function App() {
  const [route, setRoute] = useState<Route>(currentRoute);
  useEffect(() => {
    const onHash = () => setRoute(currentRoute());
    window.addEventListener("hashchange", onHash);
    openOnDiscoverIfEmpty();
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  useEffect(() => {
    document.title = `${pages[route].title} · FastMLX`;
  }, [route]);

  // The desktop app shows chat in a window of its own, without the dashboard's navigation.
  const chatWindow = route === "chat" && isDesktop;
  const Page = pages[route].view;
  return (
    <div class={`app ${route === "chat" ? "app-chat" : ""}`} data-testid="app" data-route={route}>
      {!chatWindow && (
        <header class="topbar">
          <a class="brand" href="#/models">
            FastMLX
          </a>
          <nav data-testid="nav">
            {(["models", "discover", "live", "server"] as Route[]).map((name) => (
              <a
                key={name}
                href={`#/${name}`}
                class={route === name ? "active" : ""}
                data-testid={`nav-${name}`}
              >
                {pages[name].title}
              </a>
            ))}
            {hasNative() ? (
              <button class="link" onClick={() => openChat()} data-testid="nav-chat">
                Chat
              </button>
            ) : (
              <a href="#/chat" class={route === "chat" ? "active" : ""} data-testid="nav-chat">
                Chat
              </a>
            )}
          </nav>
        </header>
      )}
      <main class="page" data-testid={`page-${route}`}>
        <Page />
      </main>
    </div>
  );
}

render(<App />, document.getElementById("app")!);
